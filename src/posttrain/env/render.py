"""Token-in-token-out: the ids the policy sampled are kept; only the environment's segment is new.

Re-tokenising a multi-turn history (decode everything, apply the chat template, encode) changes
ids wherever decode-then-encode is not the identity (merges across a turn boundary, a token the
policy split differently than the tokenizer would), so the trained tokens are no longer the
sampled ones. Here the history's ids are never produced again; each environment observation adds
the ids of one segment of text, tokenised alone.

**The rule.** Let ``P`` be the template text of the prompt the policy continued (the conversation
rendered with the generation prompt), ``c`` the assistant content it sampled (its ids decoded,
without the stop token). With the assistant turn appended, the template renders
``closed = render(history)``; with the observation too, ``opened = render(history + new,
add_generation_prompt=True)``. The template is **prefix-stable** for this turn when

* ``closed`` starts with ``P + c`` (the generation prompt opens the assistant turn, and the
  content is rendered verbatim), so ``closer = closed[len(P + c):]`` is what closes the turn;
* ``closer`` starts with the text of the stop token the policy sampled (none when the turn was
  cut by its token limit: then the segment closes the turn itself);
* ``opened`` starts with ``closed`` (adding messages does not rewrite earlier turns).

The segment is ``closer`` minus the sampled stop token's text, plus ``opened[len(closed):]``,
encoded without special-token additions. Decoding all ids gives exactly the template's text of
the conversation, while the ids of every earlier segment stay as they were. A template that
breaks one of the three conditions (one that trims content, drops earlier reasoning, or renders
the last turn differently) is refused in one line: :func:`check_template` probes it before a run,
and every turn checks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.config.errors import ConfigError
from posttrain.env.base import Message

#: Probe content: leading/trailing whitespace and a newline catch templates that trim content.
_PROBE_CONTENT = " 12 + 7 = 19 \n"


class TemplateError(ConfigError):
    """The chat template cannot render a segment exactly (not prefix-stable); one line.

    A config error: the fix is another template (``model.tokenizer_path``), not another run.
    """


def render(
    tokenizer: Any,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] = (),
    generation_prompt: bool = False,
) -> str:
    """The chat template's text for ``messages`` (tools passed only when there are some)."""
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) or None,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` alone: the template already holds every special token it wants."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of sampled ids, special tokens and spacing kept as sampled (for the environment)."""
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def first_difference(a: str, b: str) -> str:
    """Where two texts part, quoted briefly for a one-line error (a template that is not
    prefix-stable: multi-turn RL here, SFT's span marking in ``data/sft.py``)."""
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"at character {i}: {a[i : i + 20]!r} vs {b[i : i + 20]!r}"


@dataclass(frozen=True)
class Segment:
    """An observation's ids and the template text up to its generation prompt (the next ``P``)."""

    ids: list[int]
    prompt_text: str


def observation_segment(
    tokenizer: Any,
    history: Sequence[Message],
    new: Sequence[Message],
    *,
    prompt_text: str,
    stop_text: str,
    tools: Sequence[dict[str, Any]] = (),
    where: str = "chat template",
) -> Segment:
    """Ids for ``new`` after the sampled assistant turn ``history[-1]`` (see the module rule).

    ``prompt_text`` is the text the policy was prompted with; ``stop_text`` the decoded stop
    token it sampled, ``""`` when the turn hit its token limit.
    """
    content = str(history[-1]["content"])
    closed = render(tokenizer, history, tools)
    head = prompt_text + content
    if not closed.startswith(head):
        raise TemplateError(
            f"{where} is not prefix-stable: the assistant turn does not render as the generation "
            f"prompt followed by the sampled content verbatim ({first_difference(closed, head)}); "
            "use a template that renders assistant content unchanged (no trim, no reasoning "
            "removal)"
        )
    closer = closed[len(head) :]
    if not closer.startswith(stop_text):
        raise TemplateError(
            f"{where}: the policy stopped with {stop_text!r} but the template closes an "
            f"assistant turn with {closer!r}; make the stop token the one the template uses"
        )
    opened = render(tokenizer, [*history, *new], tools, generation_prompt=True)
    if not opened.startswith(closed):
        raise TemplateError(
            f"{where} is not prefix-stable: appending messages changes the text of earlier "
            f"turns ({first_difference(opened, closed)}); use a template that renders history "
            "unchanged"
        )
    text = closer[len(stop_text) :] + opened[len(closed) :]
    return Segment(ids=encode(tokenizer, text), prompt_text=opened)


def check_template(
    tokenizer: Any, tools: Sequence[dict[str, Any]] = (), stop_text: str | None = None
) -> None:
    """Preflight: a probe conversation of two turns renders segment by segment, exactly.

    Raises :class:`TemplateError` naming what breaks; ``stop_text`` defaults to the tokenizer's
    EOS token text.
    """
    stop = tokenizer.eos_token if stop_text is None else stop_text
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError(
            "the tokenizer has no chat template; multi-turn rollouts render every turn with "
            "one: set model.tokenizer_path to a tokenizer folder whose tokenizer_config.json has "
            "a prefix-stable chat_template (a tiny model from scratch: model.init_preset="
            "tiny_tools, printable ASCII with tool markers and a template)"
        )
    history: list[Message] = [{"role": "user", "content": "What is 12 + 7?"}]
    prompt = render(tokenizer, history, tools, generation_prompt=True)
    result = {"role": "tool", "name": "calculator", "content": "19"} if tools else None
    result = result or {"role": "user", "content": "<tool_response>19</tool_response>"}
    for turn, new in enumerate(([result], [{"role": "user", "content": "And 19 + 1?"}]), start=1):
        history.append({"role": "assistant", "content": _PROBE_CONTENT})
        seg = observation_segment(
            tokenizer, history, new, prompt_text=prompt, stop_text=stop or "", tools=tools,
            where=f"chat template (probe turn {turn})",
        )  # fmt: skip
        history.extend(new)
        prompt = seg.prompt_text


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders ``tools=`` (else use the tools env's fallback mode)."""
    probe = {
        "type": "function",
        "function": {
            "name": "posttrain_probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    text = render(tokenizer, [{"role": "user", "content": "hi"}], [probe])
    return "posttrain_probe_tool" in text


@dataclass
class TokenTrajectory:
    """One trajectory's ids and its policy mask (1 = sampled by the policy, 0 = environment)."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)

    def add(self, ids: Sequence[int], policy: bool) -> None:
        self.ids.extend(int(i) for i in ids)
        self.mask.extend([int(policy)] * len(ids))

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)

    @property
    def env_tokens(self) -> int:
        return len(self.mask) - sum(self.mask)
