"""The compact call form (``<tool_call>123+456</tool_call>``) and the demo's arithmetic env."""

from __future__ import annotations

import pytest

from posttrain.env import EnvironmentSpecError, arithmetic, check_environment, load_environment
from posttrain.env.arithmetic import ArithmeticToolEnv, call_body, copy_credit
from posttrain.env.tools import (
    CALCULATOR,
    ToolsEnv,
    fallback_system_prompt,
    make_tool,
    parse_compact_calls,
)


def two_args(a: str, b: str) -> str:
    """Join.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def number(x: int) -> str:
    """Echo.

    Args:
        x: A number.
    """
    return str(x)


def assistant(text: str) -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_compact_body_is_the_argument() -> None:
    calls = parse_compact_calls("<tool_call>1+2</tool_call> and <tool_call>3*4</tool_call>",
                                CALCULATOR, "expression")  # fmt: skip
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "1+2"}, None),
        ("calculator", {"expression": "3*4"}, None),
    ]
    unclosed = parse_compact_calls("<tool_call>1+2", CALCULATOR, "expression")
    assert len(unclosed) == 1 and unclosed[0].error == "<tool_call> without </tool_call>"


def test_calculator_compact_answers_and_counts_errors() -> None:
    env = load_environment("calculator_compact")()
    step = env.step(assistant("<tool_call>123+456</tool_call>"))
    assert step.messages == [{"role": "tool", "name": "calculator", "content": "579"}]
    assert step.info == {"tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    bad = env.step(assistant("<tool_call>12a</tool_call><tool_call>9"))
    assert [m["content"] for m in bad.messages] == [
        "error: CalculatorError: cannot parse '12a' as arithmetic",
        "error: <tool_call> without </tool_call>",
    ]
    assert bad.info["tool_errors"] == 2
    assert env.step(assistant("579")).done  # no call: the final answer
    check_environment("calculator_compact")


def test_json_stays_the_default_form() -> None:
    env = load_environment("calculator")()
    step = env.step(assistant("<tool_call>123+456</tool_call>"))
    assert step.messages[0]["content"].startswith("error: the call is not valid JSON")


def test_compact_fallback_prompt_names_the_form() -> None:
    text = fallback_system_prompt([CALCULATOR], "compact")
    assert "To call it, write <tool_call><expression></tool_call>" in text


@pytest.mark.parametrize(
    ("tools", "line"),
    [
        ([CALCULATOR, make_tool(two_args)], "tools environment: call_format='compact' needs "
         "exactly one tool, got ['calculator', 'two_args']; use call_format='json' for several"),
        ([make_tool(two_args)], "tools environment: call_format='compact' needs a tool with one "
         "string argument; 'two_args' takes ['a', 'b']; use call_format='json'"),
        ([make_tool(number)], "tools environment: call_format='compact' needs a tool with one "
         "string argument; 'number' takes ['x']; use call_format='json'"),
    ],
)  # fmt: skip
def test_compact_form_needs_one_tool_with_one_string_argument(tools, line) -> None:
    with pytest.raises(EnvironmentSpecError) as e:
        ToolsEnv(tools, call_format="compact")
    assert str(e.value) == line


def test_unknown_call_format_is_one_line() -> None:
    with pytest.raises(EnvironmentSpecError) as e:
        ToolsEnv([CALCULATOR], call_format="xml")  # type: ignore[arg-type]
    assert str(e.value) == "tools environment: call_format must be 'json' or 'compact', got 'xml'"


def test_copy_credit_by_position() -> None:
    assert copy_credit("123+456", "123+456") == 1.0
    assert copy_credit("123+4", "123+456") == pytest.approx(5 / 7)
    assert copy_credit("123+4567", "123+456") == pytest.approx(7 / 8)
    assert copy_credit("", "123+456") == 0.0
    assert call_body("<tool_call>12</tool_call>") == ("12", True)
    assert call_body("<tool_call>12</tool_call>y") == ("12", False)  # the turn runs on: open
    assert call_body("x<tool_call>12</tool_call>") is None  # only a turn that opens with it
    assert call_body("<tool_call>12") == ("12", False)
    assert call_body("12") is None


def test_arithmetic_env_pays_the_first_call_only() -> None:
    env = ArithmeticToolEnv()
    assert env.tools == []  # not announced: the model finds the tool by reward
    item = {"prompt": "123+456=", "answer": "579", "a": 123, "b": 456}
    assert env.reset(item) == [{"role": "user", "content": "123+456="}]
    first = env.step(assistant("<tool_call>A+A</tool_call>"))  # 246: wrong, 2 of 3 characters
    credits = (arithmetic.OPEN_CREDIT, arithmetic.CLOSE_CREDIT, arithmetic.COPY_CREDIT)
    assert (*credits, arithmetic.RIGHT_CREDIT) == (0.2, 0.1, 0.3, 0.7)
    assert first.reward == pytest.approx(0.3 + 0.3 * 2 / 3)
    assert first.messages == [{"role": "tool", "name": "calculator", "content": " 246"}]
    again = env.step(assistant("<tool_call>A+U</tool_call>"))
    assert again.reward is None and again.messages[0]["content"] == " 579"  # right-aligned
    env.reset(item)
    assert env.step(assistant("<tool_call>A+U</tool_call>")).reward == pytest.approx(1.0)
    env.reset(item)
    assert env.step(assistant("<tool_call>U+123</tool_call>")).reward == pytest.approx(1.0)
    env.reset(item)  # a failed call still earns its share of A+U's characters
    assert env.step(assistant("<tool_call>A+</tool_call>")).reward == pytest.approx(0.5)
    env.reset({"prompt": "999+999=", "answer": "1998", "a": 999, "b": 999})
    wide = env.step(assistant("<tool_call>A+U</tool_call>"))
    assert wide.messages[0]["content"] == "1998" and wide.reward == pytest.approx(1.0)
    env.reset(item)
    unclosed = env.step(assistant("<tool_call>A+"))
    assert unclosed.reward == pytest.approx(0.2 + 0.3 * 2 / 3)  # no credit for closing
    env.reset(item)  # more after the close: neither closed nor right, and its answer is unpaid
    runs_on = env.step(assistant("<tool_call>A+U</tool_call>6"))
    assert runs_on.reward == pytest.approx(0.2 + 0.3) and runs_on.info["right_calls"] == 0
    assert runs_on.messages[0]["content"] == " 579"  # the tool still answers it
    assert env.step(assistant(" 579")).reward is None
    env.reset(item)
    assert env.step(assistant("<tool_call></tool_call>")).reward == 0.0  # an empty call
    env.reset(item)
    final = env.step(assistant("579"))
    assert final.done and final.reward is None


def test_arithmetic_env_pays_the_copy_of_a_right_calls_result() -> None:
    assert arithmetic.ANSWER_CREDIT == 1.0 and arithmetic.STOP_SHARE == 0.2
    assert arithmetic.answer_credit(" 579", " 579") == pytest.approx(1.0)
    assert arithmetic.answer_credit(" 578", " 579") == pytest.approx(0.8 * 3 / 4 + 0.2)
    assert arithmetic.answer_credit(" 57", " 579") == pytest.approx(0.8 * 3 / 4)  # stops early
    assert arithmetic.answer_credit(" 5799", " 579") == pytest.approx(0.8)  # runs on
    assert arithmetic.answer_credit("", " 579") == 0.0
    env = ArithmeticToolEnv()
    assert env.info_keys == ("tool_calls", "tool_errors", "tool_timeouts", "right_calls",
                             "answer_chars")  # fmt: skip
    item = {"prompt": "123+456=", "answer": "579", "a": 123, "b": 456}
    env.reset(item)
    call = env.step(assistant("<tool_call>A+U</tool_call>"))
    assert call.info["right_calls"] == 1 and call.messages[0]["content"] == " 579"
    answer = env.step(assistant(" 578"))
    assert answer.done and answer.reward == pytest.approx(0.8 * 3 / 4 + 0.2)
    assert answer.info["answer_chars"] == 3
    env.reset(item)  # after a wrong call the answer earns nothing here (the verifier decides)
    wrong = env.step(assistant("<tool_call>A</tool_call>"))
    assert wrong.info["right_calls"] == 0 and wrong.messages[0]["content"] == " 123"
    after = env.step(assistant(" 123"))
    assert after.done and after.reward is None and "answer_chars" not in after.info


def test_arithmetic_env_answers_a_failed_call_with_error_alone() -> None:
    env = ArithmeticToolEnv()
    env.reset({"prompt": "1+2=", "answer": "3", "a": 1, "b": 2})
    step = env.step(assistant("<tool_call>A+</tool_call>"))
    assert step.messages == [{"role": "tool", "name": "calculator", "content": "error"}]
    assert step.info["tool_errors"] == 1
    env.reset({"prompt": "1+2=", "answer": "3", "a": 1, "b": 2})
    assert env.step(assistant("<tool_call>x+U</tool_call>")).messages[0]["content"] == "error"
