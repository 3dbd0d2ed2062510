"""The calculator environment of ``make demo-tools``: compact calls, with a shaped call reward.

A tiny model trained from random weights has to find the tool before it can use it, and a right
call (``<tool_call>123+456</tool_call>``, the expression copied from the prompt) is a needle in
a haystack. So the environment's reward (a term of the trajectory's score, next to the verifier
and ``reward.functions``) pays partial credit for the first turn that opens with a call: ``OPEN_CREDIT``
for a call with a body (an empty call earns nothing: it was the policy's first local
optimum), ``CLOSE_CREDIT`` more for closing it, plus ``COPY_CREDIT`` times the share of
the expression's characters its body gets right, position by position (a body longer than the
expression counts its extra characters as wrong). A call that copies the expression exactly
earns 0.5; the right final answer earns the verifier's 1 on top. The model is never told about the tool (no system turn): a prompt is
the problem, ``123+456=``, and the tool is found by reward alone. A failed call is answered
``error`` alone (a tiny model cannot read the message, and it would lengthen every trajectory
it explores); the count of errors stays in the metrics.
"""

from __future__ import annotations

from typing import Any

from posttrain.env.base import EnvStep, Message
from posttrain.env.runner import Outcome
from posttrain.env.tools import CALCULATOR, CALL_CLOSE, CALL_OPEN, ToolsEnv

#: The environment's reward for opening a call, for closing it, and for an exact copy.
OPEN_CREDIT, CLOSE_CREDIT, COPY_CREDIT = 0.05, 0.05, 0.4


def call_body(text: str) -> tuple[str, bool] | None:
    """The body of the call that opens ``text`` (to the end when unclosed) and whether it is
    closed; None when ``text`` does not start with ``<tool_call>``."""
    if not text.startswith(CALL_OPEN):
        return None
    body = text[len(CALL_OPEN) :]
    end = body.find(CALL_CLOSE)
    return (body, False) if end < 0 else (body[:end], True)


def copy_credit(body: str, expression: str) -> float:
    """Share of ``expression``'s characters ``body`` matches position by position, in [0, 1]."""
    if not expression:
        return 0.0
    hits = sum(a == b for a, b in zip(body, expression, strict=False))
    return hits / max(len(body), len(expression))


class ArithmeticToolEnv(ToolsEnv):
    """The compact calculator with no announcement and a reward for the first call's copy."""

    def __init__(self) -> None:
        super().__init__([CALCULATOR], native_tools=True, call_format="compact")
        self._expression = ""
        self._called = False

    @property
    def tools(self) -> list[dict[str, Any]]:
        """None for the template: the tiny model is not told (it finds the tool by reward)."""
        return []

    def _response(self, name: str, outcome: Outcome) -> Message:
        """The tool's result, or ``error`` alone for a failed call."""
        return {"role": "tool", "name": name, "content": outcome.text if outcome.ok else "error"}

    def reset(self, item: dict[str, Any]) -> list[Message]:
        self._expression = str(item["prompt"]).removesuffix("=")
        self._called = False
        return [{"role": "user", "content": str(item["prompt"])}]

    def step(self, messages: list[Message]) -> EnvStep:
        answer = super().step(messages)
        call = call_body(str(messages[-1].get("content", "")))
        if call is None or self._called:
            return answer
        self._called = True
        body, closed = call
        if not body:
            return EnvStep(answer.messages, answer.done, 0.0, answer.info)
        copied = copy_credit(body, self._expression)
        reward = OPEN_CREDIT + CLOSE_CREDIT * closed + COPY_CREDIT * copied
        return EnvStep(answer.messages, answer.done, reward, answer.info)


def arithmetic_tool_environment() -> ArithmeticToolEnv:
    """``env.name=posttrain.env.arithmetic:arithmetic_tool_environment``."""
    return ArithmeticToolEnv()
