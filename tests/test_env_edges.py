"""The tools environment at its edges (issue 33): what the policy writes and what a tool returns
are data, never a reason to stop the run; a tool's children do not outlive their worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from env_edge_tools import spawn, spawn_and_hang, surrogate

from posttrain.env import EpisodeLimits, TurnRequest, run_episodes
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.env.tools import ToolsEnv, calculator_environment, make_tool

TESTS = Path(__file__).resolve().parent


class Scripted:
    """A fake engine sampling one id per character of each scripted turn, then EOS."""

    def __init__(self, tok, turns: list[str]) -> None:
        self.tok, self.turns = tok, list(turns)

    def __call__(self, requests: list[TurnRequest]) -> list[list[int]]:
        text = self.turns.pop(0)
        ids = [self.tok.convert_tokens_to_ids(c) for c in text] + [self.tok.eos_token_id]
        return [ids[: requests[0].max_new_tokens]]


@pytest.fixture(scope="module")
def tok():
    return build_tools_tokenizer()


def _episode(tok, make_env, turns: list[str]):
    limits = EpisodeLimits(3, 100_000, 200_000)
    return run_episodes([{"prompt": "q"}], make_env, tok, Scripted(tok, turns), limits)[0]


def test_a_deeply_nested_json_call_is_a_tool_error_not_a_stop(tok) -> None:
    """Issue 33 item 13: 10,000-deep JSON in a call raised RecursionError out of the step."""
    deep = "<tool_call>" + "[" * 10_000 + "]" * 10_000 + "</tool_call>"
    ep = _episode(tok, calculator_environment, [deep, "done"])
    reply = ep.messages[2]
    assert reply["role"] == "tool" and reply["content"].startswith("error: the call is not ")
    assert "nested too deeply" in reply["content"]
    assert (ep.info["tool_calls"], ep.info["tool_errors"], ep.turns) == (1, 1, 2)


def test_a_call_with_an_integer_past_the_digit_limit_is_a_tool_error(tok) -> None:
    huge = '<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}"
    ep = _episode(tok, calculator_environment, [huge + "</tool_call>", "done"])
    assert ep.messages[2]["content"].startswith("error: the call is not valid JSON")
    assert ep.info["tool_errors"] == 1


def test_undecodable_tool_output_is_an_error_the_model_reads(tok) -> None:
    """Issue 33 item 12: a lone surrogate in a tool's output stopped the run in the tokenizer."""

    def make():
        return ToolsEnv([surrogate], call_format="compact")

    ep = _episode(tok, make, ["<tool_call>x</tool_call>", "done"])
    reply = ep.messages[2]["content"]
    assert reply.startswith("error: the tool's output is not valid text")
    assert "\\udcff" in reply and reply.encode("utf-8")  # named, and itself valid text
    assert ep.info["tool_errors"] == 1 and ep.turns == 2


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether ``pid`` has exited (a zombie counts: it runs no more) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_tool_s_child_is_killed_with_the_worker_at_the_end() -> None:
    """Issue 33 item 11: a tool's `sleep` children outlived the run (reparented to pid 1)."""
    env = ToolsEnv([make_tool(spawn)], call_format="compact", timeout_s=5)
    step = env.step([{"role": "assistant", "content": "<tool_call>60</tool_call>"}])
    pid = int(step.messages[0]["content"])
    assert not _gone(pid, 0.2)  # still sleeping while the worker serves
    env.runner.close()  # what the run's end does (atexit)
    assert _gone(pid)


def test_a_tool_s_child_is_killed_with_the_worker_at_the_time_limit(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = ToolsEnv([make_tool(spawn_and_hang)], call_format="compact", timeout_s=1)
    step = env.step([{"role": "assistant", "content": "<tool_call>60</tool_call>"}])
    assert step.info["tool_timeouts"] == 1
    assert _gone(int((tmp_path / "child.pid").read_text()))
    env.runner.close()


def test_a_tool_s_child_does_not_outlive_the_process_that_ran_it(tmp_path) -> None:
    script = (
        "from env_edge_tools import spawn\n"
        "from posttrain.env import ToolsEnv\n"
        "env = ToolsEnv([spawn], call_format='compact')\n"
        "step = env.step([{'role': 'assistant', 'content': '<tool_call>60</tool_call>'}])\n"
        "open('child.pid', 'w').write(step.messages[0]['content'])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{TESTS.parent / 'src'}{os.pathsep}{TESTS}"}
    out = subprocess.run([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, timeout=60, env=env, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_tools_env_takes_plain_typed_functions_and_is_exported() -> None:
    """Issue 33 item 3: the guide's ToolsEnv(tools, call_format="compact") with a plain function
    raised AttributeError ('function' object has no attribute 'schema')."""
    import posttrain.env as env_pkg
    from posttrain.env.calculator import calculator

    for name in ("ToolsEnv", "Tool", "make_tool", "load_tool", "calculator_environment"):
        assert name in env_pkg.__all__ and hasattr(env_pkg, name)
    env = env_pkg.ToolsEnv([calculator], call_format="compact")
    step = env.step([{"role": "assistant", "content": "<tool_call>2+3</tool_call>"}])
    assert step.messages == [{"role": "tool", "name": "calculator", "content": "5"}]
    assert env.tools == [env_pkg.make_tool(calculator).schema]


def test_tools_env_refuses_an_untyped_plain_function_in_one_line() -> None:
    from posttrain.env import EnvironmentSpecError

    def untyped(x):
        return x

    with pytest.raises(EnvironmentSpecError) as e:
        ToolsEnv([untyped])
    assert "tool 'untyped': no JSON schema" in str(e.value) and "\n" not in str(e.value)


def test_a_tool_name_with_a_lone_surrogate_is_answered_as_escaped_text(tok) -> None:
    call = '<tool_call>{"name": "calc\\udcff", "arguments": {}}</tool_call>'
    ep = _episode(tok, calculator_environment, [call, "done"])
    reply = ep.messages[2]
    assert reply["name"] == "calc\\udcff" and reply["content"].startswith("error: unknown tool")
    assert ep.info["tool_errors"] == 1


class _BadText:
    def reset(self, item):
        return [{"role": "user", "content": b"\xff".decode("utf-8", "surrogateescape")}]

    def step(self, messages):
        raise AssertionError("never reached")


def test_an_environment_message_that_is_not_text_is_one_line(tok) -> None:
    from posttrain.env import EnvironmentFailedError

    with pytest.raises(EnvironmentFailedError) as e:
        _episode(tok, _BadText, ["x"])
    assert str(e.value) == (
        "environment on item 0: message 0's content is not valid text (character 0); decode "
        "bytes with errors='replace'"
    )


def test_the_reward_role_closes_its_tools_at_the_end_of_the_roles(tmp_path) -> None:
    """The roles' close (local and Ray) ends the tool workers and their children: a Ray actor
    is killed without atexit."""
    from posttrain.env.tools import shared_runner
    from posttrain.placement.roles import RewardRole

    tool = make_tool(spawn)
    env = ToolsEnv([tool], call_format="compact")
    pid = int(env.step([{"role": "assistant", "content": "<tool_call>60</tool_call>"}])
              .messages[0]["content"])  # fmt: skip
    role = RewardRole.__new__(RewardRole)  # the close path alone (no model to load)
    role.episodes = object()
    role.close_tools()
    assert _gone(pid) and shared_runner((tool,), 5.0) is env.runner
    role.episodes = None
    role.close_tools()  # single-turn: nothing to close
