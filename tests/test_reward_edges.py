"""Issue 24 items 5, 11, 14: huge rewards, hostile exceptions and escape codes from reward code."""

from __future__ import annotations

import math
import signal
import textwrap

import pytest
import torch

from posttrain.data.tasks import TaskItem
from posttrain.reward import RewardError, RewardStage
from posttrain.reward.functions import MAX_ABS_REWARD
from posttrain.run.guard import run_guarded
from posttrain.run.signals import RunInterrupted, signals_raise
from posttrain.textsafe import exception_text, sanitize
from tests.test_reward_stage import _batch

USER_MODULE = textwrap.dedent(
    """
    import os, signal

    def huge(prompt, completion, answer, meta):
        return 1e308 if "6" in completion else 0.0

    def minus_huge(prompt, completion, answer, meta):
        return -1e308

    def at_bound(prompt, completion, answer, meta):
        return 1e30 if "6" in completion else -1e30

    at_bound_too = at_bound

    def big_int(prompt, completion, answer, meta):
        return 10**400

    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")

    class Fatal(BaseException):
        pass

    def bad_str(prompt, completion, answer, meta):
        raise BadStr()

    def base_exc(prompt, completion, answer, meta):
        raise Fatal("deep trouble")

    def gen_exit(prompt, completion, answer, meta):
        raise GeneratorExit

    def ctrl_c(prompt, completion, answer, meta):
        raise KeyboardInterrupt

    def term_me(prompt, completion, answer, meta):
        os.kill(os.getpid(), signal.SIGTERM)
        return 0.0

    def ansi(prompt, completion, answer, meta):
        raise ValueError("\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07bell\\rback \\u202eevil")
    """
)

ITEMS = [TaskItem("1+1=", "2", {"id": "g0"})] * 2 + [TaskItem("2*3=", "6", {"id": "g1"})] * 2
COMPLETIONS = ["2", "3", "6", "6"]
ROW = "row 2 (sample_id 12, item g1, prompt '2*3=')"


@pytest.fixture(autouse=True)
def user_module(tmp_path, monkeypatch):
    (tmp_path / "edge_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def _run(fn: str, functions: tuple[str, ...] = ()):
    stage = RewardStage(
        verifier="exact", format_weight=0.0, functions=[f"edge_rewards:{fn}", *functions],
        group_size=2,
    )  # fmt: skip
    return stage(_batch(), COMPLETIONS, ITEMS)


def _error(fn: str) -> str:
    with pytest.raises(RewardError) as e:
        _run(fn)
    return str(e.value)


# -- item 5: finite but huge rewards ---------------------------------------------------------
def test_huge_finite_reward_is_refused_naming_function_row_and_bound():
    msg = _error("huge")
    assert "reward function 'edge_rewards:huge' returned 1e+308 on " + ROW in msg
    assert "|reward| <= 1e+30" in msg
    assert "row 0" in _error("minus_huge")


def test_a_total_past_the_bound_is_refused():
    with pytest.raises(RewardError, match=r"total reward is -2e\+30 on row 0 .*<= 1e\+30"):
        _run("at_bound", ("edge_rewards:at_bound_too",))


def test_rewards_at_the_bound_keep_the_statistics_finite():
    out = _run("at_bound")
    assert torch.isfinite(out.batch.rewards).all() and torch.isfinite(out.batch.advantages).all()
    assert out.batch.rewards.dtype == torch.float32
    # group 1 holds two equal rewards (advantage 0); group 0 two equal -1e30 (advantage 0)
    assert out.batch.advantages.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert math.isfinite(out.metrics["reward/mean"]) and math.isfinite(out.metrics["reward/std"])
    assert MAX_ABS_REWARD == 1e30


def test_an_int_too_large_for_a_float_says_so():
    msg = _error("big_int")
    assert "returned an int of about 10**400, too large to be a reward" in msg
    assert "not a number" not in msg


# -- item 11: exceptions that fight back -----------------------------------------------------
@pytest.mark.parametrize(
    ("fn", "needle"),
    [
        ("bad_str", "raised BadStr: <its str() raised RuntimeError>"),
        ("base_exc", "raised Fatal: deep trouble"),
        ("gen_exit", "raised GeneratorExit"),
    ],
)
def test_hostile_exceptions_name_function_and_row(fn, needle):
    msg = _error(fn)
    assert f"reward function 'edge_rewards:{fn}' {needle} on row 0 (sample_id 10" in msg


def test_a_reward_raising_keyboard_interrupt_is_its_error_not_a_ctrl_c(capsys):
    code = run_guarded(lambda: _run("ctrl_c"))  # the CLI's boundary installs posttrain's handlers
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1
    assert "reward function 'edge_rewards:ctrl_c' raised KeyboardInterrupt on row 0" in err
    assert "no Ctrl-C reached posttrain" in err and "stopped by SIGINT" not in err


def test_a_real_signal_during_a_reward_call_is_not_blamed_on_the_function():
    assert signal.getsignal(signal.SIGTERM) is not None
    with signals_raise(), pytest.raises(RunInterrupted) as e:
        _run("term_me")
    assert e.value.signum == signal.SIGTERM


# -- item 14: escape sequences in user text --------------------------------------------------
def test_escape_sequences_are_stripped_from_the_reward_error(capsys):
    code = run_guarded(lambda: _run("ansi"))
    err = capsys.readouterr().err
    assert code == 1
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\u202e" not in err
    assert "raised ValueError: red bell back \\u202eevil on row 0" in err


def test_sanitize_and_exception_text():
    assert sanitize("a\x1b[1;31mb\x1b[0mc\x1b]8;;http://x\x1b\\d\x9b2Je") == "abcde"
    assert sanitize("tab\there\nnew\x00nul\x7fdel") == "tab here new\\x00nul\\x7fdel"
    assert sanitize("ünïcödé 中文") == "ünïcödé 中文"
    assert exception_text(ValueError("x" * 1000)).endswith("x...")
    assert len(exception_text(ValueError("x" * 1000))) == len("ValueError: ") + 300
    assert exception_text(GeneratorExit()) == "GeneratorExit"


def test_the_error_boundary_strips_escapes_from_any_message(capsys):
    from posttrain.data.tasks import TaskDataError

    def bad_row():
        raise TaskDataError("data.train_path row 3: answer '\x1b[2J\x1b[Hgotcha' is not a number")

    assert run_guarded(bad_row) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "posttrain: error: TaskDataError: data.train_path row 3: answer 'gotcha' is not a number\n"
    )
