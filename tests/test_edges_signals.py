"""Issue 24 item 8: a first signal waits a bounded time for the step, a second stops at once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from posttrain.run.signals import GracefulStop, RunInterrupted


def _signal_soon(delay: float, signum: int = signal.SIGTERM) -> threading.Timer:
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


def test_a_step_that_never_finishes_is_abandoned_after_the_grace(capsys):
    stop = GracefulStop(save_on_signal=True, checkpoint="ck/step_3", grace_s=0.3).install()
    try:
        stop.after_step(3, "ck/step_3", lambda: pytest.fail("nothing to save"))
        _signal_soon(0.1)
        began = time.monotonic()
        with pytest.raises(RunInterrupted) as e:
            time.sleep(30)  # step 4 hangs (a stopped role, a stalled disk)
        waited = time.monotonic() - began
    finally:
        stop.uninstall()
    assert 0.3 < waited < 3
    assert e.value.exit_code == 143
    assert str(e.value) == (
        "stopped by SIGTERM (the step did not finish within checkpoint.signal_grace_s=0.3 s; it "
        "was abandoned) after step 3; last complete checkpoint: ck/step_3; rerun the same "
        "command to resume from it (rl.resume=auto)"
    )
    assert "within 0.3 s (checkpoint.signal_grace_s)" in capsys.readouterr().err


def test_a_step_that_finishes_in_time_is_saved_and_the_timer_is_disarmed():
    stop = GracefulStop(save_on_signal=True, grace_s=0.5).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(
            RunInterrupted,
            match="^stopped by SIGTERM after step 1; last complete checkpoint: ck/1;",
        ):
            stop.after_step(1, None, lambda: "ck/1")
        time.sleep(0.8)  # past the grace: no second interruption arrives
    finally:
        stop.uninstall()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_second_signal_stops_at_once_inside_the_grace():
    stop = GracefulStop(save_on_signal=True, grace_s=60).install()
    try:
        _signal_soon(0.1)
        _signal_soon(1.2)
        began = time.monotonic()
        with pytest.raises(RunInterrupted, match="^stopped by SIGTERM$"):
            time.sleep(30)
        assert time.monotonic() - began < 3
    finally:
        stop.uninstall()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_uninstall_restores_the_alarm_handler_and_grace_must_be_positive():
    before = signal.getsignal(signal.SIGALRM)
    GracefulStop(save_on_signal=True, grace_s=1).install().uninstall()
    assert signal.getsignal(signal.SIGALRM) is before
    with pytest.raises(ValueError, match="grace_s must be finite and > 0"):
        GracefulStop(save_on_signal=True, grace_s=0)


def hang_when_told(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """A reward function that hangs once the test drops a ``hang`` file in the working dir."""
    from pathlib import Path

    while Path("hang").exists():
        time.sleep(0.05)
    return 0.0


def test_sigterm_ends_a_local_run_whose_reward_function_hangs(tmp_path):
    """The grace holds in the local placement too: the stop reaches into the hung reward call
    (not reported as the reward's error), and the last complete checkpoint is named."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{here.parent / 'src'}{os.pathsep}{here}"}
    opts = [f"job.output_root={tmp_path}", "rl.max_steps=1000", "rl.save_every=1",
            "data.prompts_per_step=2", "rollout.n=2", "rollout.max_tokens=3",
            "rl.micro_batch_size=4", "logging.progress=false", "checkpoint.signal_grace_s=2",
            "reward.functions=[test_edges_signals:hang_when_told]"]  # fmt: skip
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    driver = subprocess.Popen([*cmd, *opts], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("grpo/*/checkpoints/step_00000001/COMPLETE")):
        assert driver.poll() is None, driver.communicate()[1]
        assert time.monotonic() < deadline, "the run never saved its first step"
        time.sleep(0.05)
    (tmp_path / "hang").touch()
    time.sleep(1.0)
    driver.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = driver.communicate(timeout=60)
    assert time.monotonic() - sent < 15
    assert driver.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert (
        "stopped by SIGTERM (the step did not finish within checkpoint.signal_grace_s=2 s" in last
    )
    assert "last complete checkpoint:" in last and "RewardError" not in err


def test_a_hung_reward_function_fails_a_local_run_at_the_role_call_deadline(tmp_path):
    """No signal needed: a reward call past placement.role_call_timeout_s ends the local run in
    one line naming the role, exit 1."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{here.parent / 'src'}{os.pathsep}{here}"}
    (tmp_path / "hang").touch()
    opts = [f"job.output_root={tmp_path}", "rl.max_steps=3", "data.prompts_per_step=2",
            "rollout.n=2", "rollout.max_tokens=3", "rl.micro_batch_size=4", "rl.eval_every=0",
            "logging.progress=false", "placement.role_call_timeout_s=2",
            "reward.functions=[test_edges_signals:hang_when_told]"]  # fmt: skip
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    began = time.monotonic()
    done = subprocess.run([*cmd, *opts], cwd=tmp_path, env=env, text=True, timeout=120,
                          capture_output=True)  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("posttrain: error:"), done.stderr
    assert "the reward role did not return within placement.role_call_timeout_s=2 s" in last
    assert "Traceback" not in done.stderr and time.monotonic() - began < 90
