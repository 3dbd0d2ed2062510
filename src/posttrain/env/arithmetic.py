"""The calculator environment of ``make demo-tools``: named operands, a fixed call to learn.

A tiny model trained from random weights cannot find a call that copies a 7-character
expression from the prompt (the first demo measured that: it learned a constant call and a
constant answer). So this environment **binds the problem's operands to names**: in the
calculator's expressions ``A`` is the first operand and ``U`` the second (the only letters of
the ``arith_tools`` alphabet), substituted through the AST by
:func:`posttrain.env.calculator.bind_names` before the calculator evaluates the call (still no
``eval``). The right call is then the same string for every problem, ``<tool_call>A+U</tool_call>``,
and what is left to learn is the copy: the tool's result into the answer. The result comes back
right-aligned to ``RESULT_WIDTH`` characters (``<tool_response> 579</tool_response>``), so each
answer character copies the response's character at a fixed distance (the exact verifier and
``digit_match`` strip the space).

The environment's reward (a term of the trajectory's score, next to the verifier and
``reward.functions``) pays partial credit for the first turn that opens with a call: ``OPEN_CREDIT``
for a call with a body (an empty call earns nothing), ``CLOSE_CREDIT`` more for closing it and
ending the turn there, plus ``RIGHT_CREDIT`` for a closed call whose result is the problem's answer
(any expression: ``U+A`` counts) or, for any other, ``COPY_CREDIT`` times the share of
``RIGHT_CALL``'s characters the body gets right, position by position (a failed ``A+`` is the step
on the way to ``A+U``). A right call earns 1.0. The answer turn after a right call earns up to
``ANSWER_CREDIT`` more (:func:`answer_credit`: the share of the response's four characters it
copies, position by position, and a part for stopping right after them), and the right final answer
the verifier's 1 on top. Nothing pays an answer after a wrong call: paying the copy of any result
made the policy settle on a wrong call whose result it copied (measured: ``A`` alone, the first
operand). The model is never told about the tool or the names (no system turn; a prompt is the
problem, ``123+456=``); it finds both by reward alone. A failed call is answered ``error`` alone.

``right_calls`` (first calls whose result is the answer) and ``answer_chars`` (characters of
the result the answer copied) are published as ``train/env/right_calls_mean`` and
``train/env/answer_chars_mean``.
"""

from __future__ import annotations

from typing import Any

from posttrain.env.base import EnvStep, Message
from posttrain.env.calculator import bind_names
from posttrain.env.runner import Outcome
from posttrain.env.tools import CALCULATOR, CALL_CLOSE, CALL_OPEN, ToolCall, ToolsEnv
from posttrain.reward.shaping import matching_chars

#: The environment's reward for opening a call, for closing it, for each share of
#: ``RIGHT_CALL``'s characters in a wrong one, and for a right call.
OPEN_CREDIT, CLOSE_CREDIT, COPY_CREDIT, RIGHT_CREDIT = 0.2, 0.1, 0.3, 0.7
#: The names of the first and second operand in a call's expression.
FIRST, SECOND = "A", "U"
#: The call that is right for every problem.
RIGHT_CALL = f"{FIRST}+{SECOND}"
#: Width the calculator's result is right-aligned to (a sum of two three-digit numbers fits).
RESULT_WIDTH = 4
#: Most the answer after a right call earns for copying its result, and the share of it paid
#: for ending right after the copied characters.
ANSWER_CREDIT, STOP_SHARE = 1.0, 0.2


def call_body(text: str) -> tuple[str, bool] | None:
    """The body of the call that opens ``text`` (to the end when unclosed) and whether it is
    closed, which here means the turn ends right after its first ``</tool_call>``; None when
    ``text`` does not start with ``<tool_call>``.

    A call with more after its close is not closed: every right call is then the same turn,
    token for token, so the answer turns after it share one state (``rl.credit=state`` judges
    them against each other; trailing tokens, which nothing else penalises, made most of them
    states of their own: measured in docs/guides/seeds.md)."""
    if not text.startswith(CALL_OPEN):
        return None
    body = text[len(CALL_OPEN) :]
    end = body.find(CALL_CLOSE)
    if end < 0:
        return body, False
    return body[:end], end + len(CALL_CLOSE) == len(body)


def copy_credit(body: str, expression: str) -> float:
    """Share of ``expression``'s characters ``body`` matches position by position, in [0, 1]."""
    if not expression:
        return 0.0
    return matching_chars(body, expression) / max(len(body), len(expression))


def answer_credit(text: str, result: str) -> float:
    """In [0, 1]: ``1 - STOP_SHARE`` times the share of ``result``'s characters ``text`` copies
    position by position, plus ``STOP_SHARE`` when it is as long as ``result``."""
    share = matching_chars(text, result) / len(result)
    return (1 - STOP_SHARE) * share + STOP_SHARE * (len(text) == len(result))


class ArithmeticToolEnv(ToolsEnv):
    """The compact calculator with the operands named, no announcement, a shaped first call
    and a shaped copy of its result."""

    info_keys = (*ToolsEnv.info_keys, "right_calls", "answer_chars")

    def __init__(self) -> None:
        super().__init__([CALCULATOR], native_tools=True, call_format="compact")
        self._names: dict[str, int] = {}
        self._answer = ""
        self._called = False
        self._result: str | None = None  # the right call's response, once made

    @property
    def tools(self) -> list[dict[str, Any]]:
        """None for the template: the tiny model is not told (it finds the tool by reward)."""
        return []

    def _run(self, call: ToolCall, index: int) -> Outcome:
        """The call with the operands' names bound to this problem's values."""
        if call.error is None and self._argument is not None:
            body = str(call.arguments.get(self._argument, ""))
            call = ToolCall(call.name, {self._argument: bind_names(body, self._names)})
        return super()._run(call, index)

    def _response(self, name: str, outcome: Outcome) -> Message:
        """The result right-aligned to ``RESULT_WIDTH``, or ``error`` alone for a failed call."""
        text = outcome.text.rjust(RESULT_WIDTH) if outcome.ok else "error"
        return {"role": "tool", "name": name, "content": text}

    def reset(self, item: dict[str, Any]) -> list[Message]:
        self._names = {FIRST: int(item["a"]), SECOND: int(item["b"])}
        self._answer = str(item["answer"]).strip()
        self._called = False
        self._result = None
        return [{"role": "user", "content": str(item["prompt"])}]

    def step(self, messages: list[Message]) -> EnvStep:
        text = str(messages[-1].get("content", ""))
        answer = super().step(messages)
        call = call_body(text)
        if call is None:
            if self._result is None or not answer.done:
                return answer
            info = {**answer.info, "answer_chars": matching_chars(text, self._result)}
            return EnvStep(done=True, reward=ANSWER_CREDIT * answer_credit(text, self._result),
                           info=info)  # fmt: skip
        if self._called:
            return answer
        self._called = True
        body, closed = call
        if not body:
            return EnvStep(answer.messages, answer.done, 0.0, answer.info)
        response = str(answer.messages[0].get("content", "")) if answer.messages else ""
        ok = answer.info.get("tool_errors", 1) == 0
        right = closed and ok and response.strip() == self._answer
        if right:
            self._result = response
        shape = RIGHT_CREDIT if right else COPY_CREDIT * copy_credit(body, RIGHT_CALL)
        reward = OPEN_CREDIT + CLOSE_CREDIT * closed + shape
        return EnvStep(
            answer.messages, answer.done, reward, {**answer.info, "right_calls": int(right)}
        )


def arithmetic_tool_environment() -> ArithmeticToolEnv:
    """``env.name=posttrain.env.arithmetic:arithmetic_tool_environment``."""
    return ArithmeticToolEnv()
