"""Prompt templates: turn a task item into the text the policy continues.

``plain`` is the item's prompt as is (tiny character-level models that never saw a chat
format). ``chat`` renders the tokenizer's own chat template with a system message asking for the
final answer inside ``\\boxed{}`` -- the format :func:`posttrain.reward.extract.follows_format`
checks and the verifiers read first.
"""

from __future__ import annotations

from typing import Any, Literal

from posttrain.data.tasks.base import TaskItem

PromptTemplate = Literal["plain", "chat"]
TEMPLATES: tuple[str, ...] = ("plain", "chat")

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem step by step. Then give the final answer, and nothing else, inside "
    "\\boxed{}, once, at the end of your response. For example: \\boxed{42}."
)


def format_prompt(
    item: TaskItem,
    template: PromptTemplate,
    tokenizer: Any = None,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> str:
    """The prompt text for ``item`` under ``template``.

    For ``chat`` the tokenizer must carry a chat template; the result ends with the
    generation prompt (``add_generation_prompt=True``), so the policy starts the assistant turn.
    ``system_prompt=None`` sends no system message (for templates that reject the system role).
    """
    if template == "plain":
        return item.prompt
    if template != "chat":
        raise ValueError(f"prompt template must be one of {TEMPLATES}, got {template!r}")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "prompt template 'chat' needs a tokenizer that has a chat template "
            "(tokenizer.chat_template is empty); use template 'plain' for models without one"
        )
    messages = [{"role": "user", "content": item.prompt}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise ValueError(
            f"tokenizer.apply_chat_template returned {type(text).__name__}, expected str"
        )
    return text
