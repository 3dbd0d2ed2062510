"""A small Hermes/Qwen-style chat template for the char-level tokenizers, with tool turns.

Roles render as one letter (``S:``, ``U:``, ``A:``) and every turn ends with ``<eos>`` and a
newline, so a tiny model's context stays short. Tool results go, as in Qwen's template, into one
user turn per run of consecutive ``tool`` messages, each inside ``<tool_response>`` markers; with
``tools=`` the system turn lists the tool names only (a tiny model cannot read JSON schemas).
The template is prefix-stable (:func:`posttrain.env.render.check_template` accepts it).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from posttrain.model.tokenizer import CHARACTERS, TOOL_MARKERS, build_char_tokenizer

NL = "{{ '\\n' }}"

TOOLS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}S:tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "{{ eos_token }}" + NL + "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}U:{% endif %}"
    "<tool_response>{{ m.content }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ eos_token }}" + NL + ""
    "{% endif %}"
    "{% else %}{{ m.role[0] | upper }}:{{ m.content }}{{ eos_token }}" + NL + "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def build_tools_tokenizer(characters: tuple[str, ...] = CHARACTERS) -> PreTrainedTokenizerFast:
    """The char-level tokenizer with the tool-call markers as tokens and the template above."""
    tokenizer = build_char_tokenizer(characters, markers=TOOL_MARKERS)
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    return tokenizer
