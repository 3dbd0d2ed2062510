"""The tools environment: schemas, Hermes tool-call parsing, time limits, errors as tool output."""

from __future__ import annotations

import os
import time

import pytest
from transformers.utils import get_json_schema

from posttrain.env import EnvironmentSpecError, EnvStep, check_environment, load_environment
from posttrain.env.calculator import calculator
from posttrain.env.runner import MAX_OUTPUT_CHARS, ToolRunner, call_here
from posttrain.env.tools import (
    CALCULATOR,
    ToolsEnv,
    calculator_environment,
    make_tool,
    parse_tool_calls,
)


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "woke"


def crash(code: int) -> str:
    """Exit the process abruptly.

    Args:
        code: Exit status.
    """
    os._exit(code)


def shout(text: str) -> str:
    """Repeat text many times.

    Args:
        text: What to repeat.
    """
    return text * 10_000


def untyped(x):  # no hints, no docstring: no schema
    return x


def call(name: str, **arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def assistant(text: str) -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_schema_comes_from_get_json_schema() -> None:
    assert CALCULATOR.schema == get_json_schema(calculator)
    assert CALCULATOR.name == "calculator"
    params = CALCULATOR.schema["function"]["parameters"]
    assert params["required"] == ["expression"]
    assert params["properties"]["expression"]["type"] == "string"


def test_untyped_function_is_refused_in_one_line() -> None:
    with pytest.raises(EnvironmentSpecError) as e:
        make_tool(untyped)
    assert "tool 'untyped': no JSON schema" in str(e.value)
    assert "\n" not in str(e.value)


def test_parse_tool_calls() -> None:
    text = (
        'I will compute.<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}'
        '</tool_call> and <tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"3\\"}"}'
        "\n</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "1+2"}, None),
        ("calculator", {"expression": "3"}, None),  # OpenAI-style string arguments
    ]
    assert parse_tool_calls("the answer is 3") == []
    assert "not valid JSON" in parse_tool_calls("<tool_call>{oops</tool_call>")[0].error
    assert '"name"' in parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[0].error
    bad_args = parse_tool_calls('<tool_call>{"name": "c", "arguments": [1]}</tool_call>')
    assert "JSON object" in bad_args[0].error
    unclosed = parse_tool_calls('<tool_call>{"name": "calculator"')
    assert len(unclosed) == 1 and "without </tool_call>" in unclosed[0].error


def test_step_runs_calls_and_counts() -> None:
    env = calculator_environment()
    text = call("calculator", expression="123 + 456") + call("calculator", expression="1/0")
    step = env.step(assistant(text))
    assert step.done is False
    assert step.messages == [
        {"role": "tool", "name": "calculator", "content": "579"},
        {"role": "tool", "name": "calculator", "content": "error: CalculatorError: division by "
         "zero in /"},
    ]  # fmt: skip
    assert step.info == {"tool_calls": 2, "tool_errors": 1, "tool_timeouts": 0}


def test_no_call_ends_the_episode() -> None:
    step = calculator_environment().step(assistant("The answer is 579."))
    assert step == EnvStep(done=True, info={"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (call("search", query="x"), "error: unknown tool 'search'; tools: ['calculator']"),
        (call("calculator", expr="1"), "error: TypeError:"),
        (call("calculator"), "error: TypeError:"),
        ("<tool_call>not json</tool_call>", "error: the call is not valid JSON"),
    ],
)
def test_errors_go_back_as_tool_output(text: str, error: str) -> None:
    step = calculator_environment().step(assistant(text))
    assert step.messages[0]["content"].startswith(error)
    assert step.info["tool_errors"] == 1 and step.info["tool_calls"] == 1


def test_calls_over_the_turn_limit_are_answered_with_an_error() -> None:
    env = ToolsEnv([CALCULATOR], max_calls_per_turn=2)
    step = env.step(assistant(call("calculator", expression="1") * 3))
    assert [m["content"] for m in step.messages[:2]] == ["1", "1"]
    assert step.messages[2]["content"] == "error: more than 2 tool calls in one turn"
    assert step.info == {"tool_calls": 3, "tool_errors": 1, "tool_timeouts": 0}


def test_timeout_kills_the_call_and_the_next_call_works() -> None:
    runner = ToolRunner([slow], timeout_s=0.5)
    try:
        start = time.perf_counter()
        out = runner.call(0, {"seconds": 30})
        assert time.perf_counter() - start < 5
        assert (out.ok, out.timed_out, out.text) == (False, True, "timed out after 0.5 s")
        assert runner.call(0, {"seconds": 0}).text == "woke"
        assert runner.starts == 2  # the stuck worker was killed and replaced
    finally:
        runner.close()


def test_timeout_is_counted_by_the_env() -> None:
    env = ToolsEnv([make_tool(slow)], timeout_s=0.3)
    step = env.step(assistant(call("slow", seconds=30)))
    assert step.messages[0]["content"] == "error: timed out after 0.3 s"
    assert step.info == {"tool_calls": 1, "tool_errors": 1, "tool_timeouts": 1}


def test_crashing_tool_is_an_error_and_the_worker_restarts() -> None:
    runner = ToolRunner([crash, calculator], timeout_s=5)
    try:
        out = runner.call(0, {"code": 3})
        assert (out.ok, out.timed_out) == (False, False)
        assert "exited without a result" in out.text
        assert runner.call(1, {"expression": "2*3"}).text == "6"
    finally:
        runner.close()


def test_long_output_is_cut() -> None:
    runner = ToolRunner([shout], timeout_s=5)
    try:
        out = runner.call(0, {"text": "ab"}).text
        assert out.startswith("ab" * (MAX_OUTPUT_CHARS // 2))
        assert out.endswith(f"... [{20_000 - MAX_OUTPUT_CHARS} more characters cut]")
    finally:
        runner.close()


def test_in_process_calls_answer_as_the_worker_does_and_fork_none() -> None:
    """The built-in calculator runs in the caller (it bounds its own work): the same outcomes as
    through the worker, errors and cut output included, and no worker is started for it."""
    env = calculator_environment()
    assert CALCULATOR.in_process and not make_tool(calculator).in_process
    starts = env.runner.starts
    runner = ToolRunner([calculator, shout], timeout_s=5)
    try:
        for expression in ("123+456", "1/0", "9**9**9", "x+1", "2**0.5"):
            step = env.step(assistant(call("calculator", expression=expression)))
            want = runner.call(0, {"expression": expression})
            text = want.text if want.ok else f"error: {want.text}"
            assert step.messages[0]["content"] == text
        assert call_here(shout, {"text": "ab"}) == runner.call(1, {"text": "ab"})
    finally:
        runner.close()
    assert env.runner.starts == starts


def test_envs_share_one_worker() -> None:
    assert calculator_environment().runner is calculator_environment().runner


def test_fallback_mode_for_templates_without_tools() -> None:
    env = calculator_environment(native_tools=False)
    assert env.tools == []
    opening = env.reset({"prompt": "What is 2+2?"})
    assert opening[0]["role"] == "system"
    assert '"name": "calculator"' in opening[0]["content"]
    assert "<tool_call>" in opening[0]["content"]
    assert opening[1] == {"role": "user", "content": "What is 2+2?"}
    step = env.step(assistant(call("calculator", expression="2+2")))
    assert step.messages == [{"role": "user", "content": "<tool_response>4</tool_response>"}]


def test_native_mode_hands_schemas_to_the_template() -> None:
    env = calculator_environment()
    assert env.tools == [CALCULATOR.schema]
    assert env.reset({"prompt": "hi"}) == [{"role": "user", "content": "hi"}]


def test_load_builtin_and_tools_environments() -> None:
    env = load_environment("calculator")()
    assert isinstance(env, ToolsEnv) and env.tools == [CALCULATOR.schema]
    env = load_environment("tools", ["posttrain.env.calculator:calculator"])()
    assert [t.name for t in env.tool_list] == ["calculator"]
    check_environment("calculator")


def test_user_environment_from_working_directory(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_env_mod.py").write_text(
        "from posttrain.env import EnvStep\n"
        "class Echo:\n"
        "    def reset(self, item):\n"
        "        return [{'role': 'user', 'content': item['prompt']}]\n"
        "    def step(self, messages):\n"
        "        return EnvStep(done=True, reward=1.0)\n"
        "def make():\n"
        "    return Echo()\n"
        "def not_env():\n"
        "    return 3\n"
        "def needs_arg(x):\n"
        "    return Echo()\n"
        "lam = lambda: Echo()\n"
    )
    monkeypatch.chdir(tmp_path)
    check_environment("my_env_mod:make")
    cases = {
        "my_env_mod:not_env": "returned a int without reset and step",
        "my_env_mod:needs_arg": "cannot be called with no arguments",
        "my_env_mod:lam": "lambda or nested function",
        "my_env_mod:absent": "has no attribute 'absent'",
        "no_such_env_mod:make": "cannot import module 'no_such_env_mod'",
        "nocolon": "expected 'module:function' (one colon) (or a built-in name: calculator, calculator_compact, tools)",
        "tools": "names no tools",
    }
    for spec, message in cases.items():
        with pytest.raises(EnvironmentSpecError) as e:
            check_environment(spec)
        assert message in str(e.value), (spec, str(e.value))
        assert str(e.value).startswith(f"environment {spec!r}: ")
        assert str(e.value).count(f"environment {spec!r}") == 1
        assert "\n" not in str(e.value)
    with pytest.raises(EnvironmentSpecError, match="only the 'tools' environment takes them"):
        check_environment("calculator", ["posttrain.env.calculator:calculator"])
    with pytest.raises(EnvironmentSpecError, match="tool 'my_env_mod:absent'"):
        check_environment("tools", ["my_env_mod:absent"])
