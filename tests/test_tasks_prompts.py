"""Prompt templates: plain text, and the tokenizer's chat template with the system prompt."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from posttrain.data.tasks import DEFAULT_SYSTEM_PROMPT, TaskItem, format_prompt

CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ITEM = TaskItem("12+7=", "19", {"id": "x"})


def _tokenizer(chat_template: str | None):
    vocab = {c: i for i, c in enumerate("<>|=+0123456789abcdefghijklmnopqrstuvwxyz ")}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?" if "?" in vocab else " "))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.chat_template = chat_template
    return fast


def test_plain_is_the_prompt_itself():
    assert format_prompt(ITEM, "plain", None) == "12+7="


def test_chat_uses_the_template_with_system_prompt_and_generation_prompt():
    text = format_prompt(ITEM, "chat", _tokenizer(CHAT))
    assert text == (f"<|system|>{DEFAULT_SYSTEM_PROMPT}<|end|><|user|>12+7=<|end|><|assistant|>")
    assert "\\boxed{}" in DEFAULT_SYSTEM_PROMPT
    assert format_prompt(ITEM, "chat", _tokenizer(CHAT), system_prompt=None) == (
        "<|user|>12+7=<|end|><|assistant|>"
    )


def test_chat_without_a_chat_template_is_an_error():
    with pytest.raises(ValueError, match="needs a tokenizer that has a chat template"):
        format_prompt(ITEM, "chat", _tokenizer(None))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        format_prompt(ITEM, "chat", None)


def test_unknown_template():
    with pytest.raises(ValueError, match=r"one of \('plain', 'chat'\)"):
        format_prompt(ITEM, "raw", None)


def test_user_template_places_the_question_and_keeps_braces_verbatim():
    template = "Q: {prompt} End with \\boxed{7}."
    assert format_prompt(ITEM, "plain", None, user_template=template) == (
        "Q: 12+7= End with \\boxed{7}."
    )
    text = format_prompt(ITEM, "chat", _tokenizer(CHAT), system_prompt="S", user_template=template)
    assert text == "<|system|>S<|end|><|user|>Q: 12+7= End with \\boxed{7}.<|end|><|assistant|>"
    # A question holding the placeholder text itself is inserted once, not expanded again.
    odd = TaskItem("what is {prompt}?", "x", {"id": "y"})
    assert format_prompt(odd, "plain", None, user_template="<{prompt}>") == "<what is {prompt}?>"


@pytest.mark.parametrize("template", ["no placeholder", "{prompt} and {prompt}"])
def test_user_template_needs_the_placeholder_once(template):
    from posttrain.config.errors import ConfigValueError
    from posttrain.config.sections import DataConfig

    with pytest.raises(ConfigValueError, match="data.user_template.*exactly once"):
        DataConfig(user_template=template)
