"""Prompt templates: turn a task item into the text the policy continues.

``plain`` is the item's prompt as is (tiny character-level models that never saw a chat
format). ``chat`` renders the tokenizer's own chat template with a system message asking for the
final answer inside ``\\boxed{}`` -- the format :func:`posttrain.reward.extract.follows_format`
checks and the verifiers read first.
"""

from __future__ import annotations

from typing import Any, Literal

from posttrain.config.sections import DEFAULT_SYSTEM_PROMPT
from posttrain.data.tasks.base import TaskItem

PromptTemplate = Literal["plain", "chat"]
TEMPLATES: tuple[str, ...] = ("plain", "chat")


def question_text(item: TaskItem, user_template: str = "{prompt}") -> str:
    """The user's question: ``user_template`` with its ``{prompt}`` replaced by ``item.prompt``
    (the rest kept verbatim, no ``str.format``). The ``plain`` template's whole prompt."""
    return user_template.replace("{prompt}", item.prompt, 1)


def chat_messages(
    item: TaskItem,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    user_template: str = "{prompt}",
) -> list[dict[str, str]]:
    """The ``chat`` template's conversation before the answer: the system message (unless
    ``system_prompt`` is None) and the question; what rows written from samples start with
    (``posttrain rft``), so they render the prompt the policy was sampled with."""
    messages = [{"role": "user", "content": question_text(item, user_template)}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def format_prompt(
    item: TaskItem,
    template: PromptTemplate,
    tokenizer: Any = None,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    user_template: str = "{prompt}",
) -> str:
    """The prompt text for ``item`` under ``template``.

    ``user_template`` places the question: its ``{prompt}`` is replaced by ``item.prompt`` and
    the rest is kept verbatim (no ``str.format``, so a ``\\boxed{7}`` in it stays as written).

    For ``chat`` the tokenizer must carry a chat template; the result ends with the
    generation prompt (``add_generation_prompt=True``), so the policy starts the assistant turn.
    ``system_prompt=None`` sends no system message (for templates that reject the system role).
    """
    if template == "plain":
        return question_text(item, user_template)
    if template != "chat":
        raise ValueError(f"prompt template must be one of {TEMPLATES}, got {template!r}")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "prompt template 'chat' needs a tokenizer that has a chat template "
            "(tokenizer.chat_template is empty); use template 'plain' for models without one"
        )
    messages = chat_messages(item, system_prompt=system_prompt, user_template=user_template)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise ValueError(
            f"tokenizer.apply_chat_template returned {type(text).__name__}, expected str"
        )
    return text
