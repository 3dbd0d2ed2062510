"""GracefulStop's decisions, without a training run: finish and save, or stop at once."""

from __future__ import annotations

import signal

import pytest

from posttrain.run.guard import run_guarded
from posttrain.run.signals import GracefulStop, RunInterrupted


def test_first_signal_finishes_the_step_and_saves_it_once():
    saves = []
    stop = GracefulStop(save_on_signal=True, checkpoint="ck/step_2")
    stop.after_step(3, None, lambda: saves.append(3) or "ck/step_3")
    stop.handle(signal.SIGTERM, None)  # arrives during step 4
    with pytest.raises(RunInterrupted) as e:
        stop.after_step(4, None, lambda: saves.append(4) or "ck/step_4")
    assert saves == [4] and e.value.exit_code == 143
    assert str(e.value).startswith(
        "stopped by SIGTERM after step 4; last complete checkpoint: ck/step_4"
    )


def test_a_step_saved_anyway_is_not_saved_twice_and_a_second_signal_stops_at_once():
    stop = GracefulStop(save_on_signal=True)
    stop.handle(signal.SIGINT, None)
    with pytest.raises(RunInterrupted, match="after step 1; last complete checkpoint: ck/1"):
        stop.after_step(1, "ck/1", lambda: pytest.fail("saved twice"))
    again = GracefulStop(save_on_signal=True, checkpoint="ck/0")
    again.handle(signal.SIGINT, None)
    with pytest.raises(RunInterrupted, match="stopped by SIGINT; last complete checkpoint: ck/0"):
        again.handle(signal.SIGINT, None)


def test_without_save_on_signal_the_first_signal_stops_at_once():
    stop = GracefulStop(save_on_signal=False)
    with pytest.raises(RunInterrupted, match="no checkpoint was written yet") as e:
        stop.after_step(1, None, lambda: "x") or stop.handle(signal.SIGINT, None)
    assert e.value.exit_code == 130


def test_guard_reports_a_signal_outside_the_loop_in_one_line(capsys):
    def fn():
        signal.raise_signal(signal.SIGTERM)
        return 0

    before = signal.getsignal(signal.SIGTERM)
    assert run_guarded(fn) == 143
    assert capsys.readouterr().err == "posttrain: stopped by SIGTERM\n"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
