"""Fault injection: kills at every write point, damaged checkpoints, concurrent starts, signals,
a full disk. Each case asserts that the newest state that verifies is used, that no metrics step is
lost or duplicated, and that the user sees one line.

Runs go through the CLI's ``main`` in this process or in a forked child (a kill there is a real
SIGKILL at the chosen write point, and forking costs no second import of torch).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import VOCAB, pg_objective, tiny_llama

import posttrain.fileio
import posttrain.trainer.checkpoint as checkpoint_module
from posttrain.entrypoints.cli import main
from posttrain.metrics.sinks import JsonlSink
from posttrain.run.lock import RunLock, RunLockedError
from posttrain.testing import synthetic_batch
from posttrain.trainer import CheckpointError, CheckpointManager, LLMTrainer, ResumeError
from posttrain.trainer.manifest import verify

STEPS = 6


def opts(tmp: Path, **extra) -> list[str]:
    values = {
        "job.output_root": tmp / "out", "model.name_or_path": tmp.parent / "arith",
        "rl.max_steps": STEPS, "rl.save_every": 1, "rl.eval_every": 3,
        "data.prompts_per_step": 4, "rollout.n": 4, "checkpoint.keep_last": 2,
        "logging.progress": False,
    }  # fmt: skip
    values.update(extra)
    return [
        "grpo",
        "--config",
        "arithmetic_clipped",
        "--",
        *(f"{k}={v}" for k, v in values.items()),
    ]


def run_dir(tmp: Path) -> Path:
    return tmp / "out" / "grpo" / "arithmetic_clipped"


def metric_rows(tmp: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir(tmp) / "metrics.jsonl").read_text().splitlines()]


def comparable(rows: list[dict]) -> list[tuple]:
    return [(r["step"], r.get("train/loss"), r.get("val/accuracy")) for r in rows]


def in_child(tmp: Path, fn) -> tuple[int, str]:
    """Run ``fn()`` in a forked child; its exit status (negative: killed by that signal), stderr."""
    err = tmp / f"child-{time.monotonic_ns()}.err"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns into pytest
        code = 1
        try:
            torch.set_num_threads(1)  # the parent's thread pool does not survive a fork
            sys.stderr = sys.stdout = open(err, "w", buffering=1)  # noqa: SIM115
            code = fn()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err.read_text() if err.exists() else ""


def kill_self(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run every interrupted one must reproduce exactly."""
    tmp = tmp_path_factory.mktemp("straight")
    assert main(opts(tmp)) == 0  # the recipe builds the tiny model next to the run roots
    return comparable(metric_rows(tmp))


def finish_and_compare(tmp: Path, straight, capsys) -> None:
    capsys.readouterr()
    assert main(opts(tmp)) == 0, capsys.readouterr().err
    assert comparable(metric_rows(tmp)) == straight  # nothing lost, nothing twice, same numbers
    ckpts = run_dir(tmp) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000005", "step_00000006"]
    verify(ckpts / "step_00000006", STEPS)


# -- SIGKILL at each write point, then resume ------------------------------------------------
def _kill_in_manifest_of_step_3(monkeypatch):
    real = checkpoint_module.write_manifest
    monkeypatch.setattr(
        checkpoint_module, "write_manifest",
        lambda d, step: kill_self() if step == 3 else real(d, step),
    )  # fmt: skip


def _kill_in_prune(monkeypatch):
    real = checkpoint_module.shutil.rmtree

    def rmtree(path, *a, **k):
        if Path(path).name.startswith("step_"):
            assert not (Path(path) / "COMPLETE").exists()  # the marker goes first
            if Path(path).name == "step_00000001":
                kill_self()
        real(path, *a, **k)

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", rmtree)


def _kill_mid_metrics_line(monkeypatch):
    real = JsonlSink.write

    def write(self, step, metrics):
        if step == 4:
            self._f.write('{"step": 4, "train/lo')
            self._f.flush()
            kill_self()
        real(self, step, metrics)

    monkeypatch.setattr(JsonlSink, "write", write)


@pytest.mark.parametrize(
    "inject", [_kill_in_manifest_of_step_3, _kill_in_prune, _kill_mid_metrics_line]
)
def test_sigkill_at_a_write_point_then_resume_matches_straight_run(
    tmp_path, straight, inject, monkeypatch, capsys
):
    def child():
        inject(monkeypatch)
        return main(opts(tmp_path))

    code, err = in_child(tmp_path, child)
    assert code == -signal.SIGKILL, err
    finish_and_compare(tmp_path, straight, capsys)


def test_sigkill_while_resume_rewrites_metrics_keeps_history(tmp_path, straight, capsys):
    def first():
        real = JsonlSink.write
        JsonlSink.write = lambda s, step, m: kill_self() if step == 5 else real(s, step, m)
        return main(opts(tmp_path, **{"rl.save_every": 2}))

    assert in_child(tmp_path, first)[0] == -signal.SIGKILL
    before = (run_dir(tmp_path) / "metrics.jsonl").read_text()
    assert [r["step"] for r in metric_rows(tmp_path)] == [0, 1, 2, 3, 4]

    def second():  # dies inside the atomic rewrite that trims steps past checkpoint 4
        real = os.replace
        posttrain.fileio.os.replace = lambda src, dst: (
            kill_self() if Path(dst).name == "metrics.jsonl" else real(src, dst)
        )
        return main(opts(tmp_path))

    assert in_child(tmp_path, second)[0] == -signal.SIGKILL
    assert (run_dir(tmp_path) / "metrics.jsonl").read_text() == before
    finish_and_compare(tmp_path, straight, capsys)


# -- signals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("signum", "save_on_signal", "code"),
    [(signal.SIGTERM, True, 143), (signal.SIGINT, False, 130)],
)
def test_signal_stops_cleanly_and_says_how_to_resume(
    tmp_path, straight, signum, save_on_signal, code, capsys
):
    long = opts(tmp_path, **{"rl.max_steps": 10_000, "rl.save_every": 3,
                             "checkpoint.save_on_signal": save_on_signal})  # fmt: skip
    metrics = run_dir(tmp_path) / "metrics.jsonl"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns into pytest
        torch.set_num_threads(1)
        sys.stderr = open(tmp_path / "err", "w", buffering=1)  # noqa: SIM115
        os._exit(main(long))
    deadline = time.monotonic() + 60
    while not metrics.exists() or metrics.read_text().count("\n") < 5:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(pid, signum)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    err = (tmp_path / "err").read_text().strip().splitlines()
    assert status == code, err
    last = err[-1]
    assert last.startswith(f"posttrain: stopped by {signal.Signals(signum).name} after step ")
    assert "rerun the same command" in last and "Traceback" not in "\n".join(err)
    stopped = int(last.split("after step ")[1].split(";")[0])
    named = Path(last.split("last complete checkpoint: ")[1].split(";")[0])
    saved = int(named.name.removeprefix("step_"))
    assert saved == stopped if save_on_signal else stopped - 3 <= saved <= stopped
    verify(named, saved)
    assert not list(named.parent.glob(".tmp-*"))
    steps = [r["step"] for r in metric_rows(tmp_path)]
    assert steps == list(range(len(steps))) and len(steps) >= stopped + 1
    # The same command (a shorter run here) resumes from there, exactly.
    target = max(STEPS, saved)
    assert main(opts(tmp_path, **{"rl.max_steps": target})) == 0, capsys.readouterr().err
    assert [r["step"] for r in metric_rows(tmp_path)] == list(range(target + 1))


# -- concurrent start ------------------------------------------------------------------------
def test_second_writer_refuses_in_one_line_and_a_dead_holder_is_taken_over(
    tmp_path, straight, capsys, caplog
):
    rd = run_dir(tmp_path)
    rd.mkdir(parents=True)
    with RunLock(rd):
        assert main(opts(tmp_path)) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"in use by pid {os.getpid()}" in err, err
    assert not (rd / "checkpoints").exists()  # it wrote nothing

    code, _ = in_child(tmp_path, lambda: RunLock(rd).acquire() or kill_self())
    assert code == -signal.SIGKILL and (rd / ".lock").exists()  # a lock left by a dead run
    with pytest.raises(RunLockedError, match="in use by pid"), RunLock(rd), RunLock(rd):
        pass
    assert main(opts(tmp_path, **{"rl.max_steps": 2})) == 0
    assert "taking over the lock" in caplog.text and "that process is gone" in caplog.text


# -- damaged checkpoints ---------------------------------------------------------------------
def make_trainer():
    return LLMTrainer(tiny_llama(dtype=torch.float32), pg_objective("token-mean"), lr=1e-2,
                      micro_batch_size=3)  # fmt: skip


CONFIG = {"rl": {"max_steps": 4}}


@pytest.fixture
def three(tmp_path):
    """Checkpoints 1, 2, 3 and the weights of each."""
    trainer, manager, weights = make_trainer(), CheckpointManager(tmp_path, keep_last=0), {}
    for step in (1, 2, 3):
        trainer.train_on_batch(synthetic_batch(VOCAB, 6, seed=step, sample_id_offset=6 * step))
        manager.save(step, trainer, config=CONFIG, data_state={"cursor": step})
        weights[step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    return manager, weights


def _flip(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_step(path: Path) -> None:
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "step": 2}))


DAMAGE = {
    "truncated weights": ("model/model.safetensors", _truncate),
    "flipped weight bytes": ("model/model.safetensors", _flip),
    "flipped optimizer bytes": ("trainer.pt", _flip),
    "random optimizer state": ("trainer.pt", _garbage),
    "random data state": ("data_state.pt", _garbage),
    "broken meta.json": ("meta.json", _truncate),
    "meta.json step edited": ("meta.json", _edit_step),
    "manifest edited": ("manifest.json", _flip),
    "no COMPLETE (prune stopped)": ("COMPLETE", Path.unlink),
    "rng state missing": ("rng_rank0.pt", Path.unlink),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_the_newest_that_verifies(three, case):
    manager, weights = three
    name, damage = DAMAGE[case]
    damage(manager.root / "step_00000003" / name)
    trainer = make_trainer()
    with pytest.warns(UserWarning, match="step_00000003"):
        state = manager.resume(trainer, mode="must", config=CONFIG)
    assert state.step == 2 and state.data_state == {"cursor": 2}
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, weights[2][k]), k
    assert not (manager.root / "step_00000003").exists()  # moved aside, kept for inspection
    assert (manager.root / ".corrupt-step_00000003").is_dir()


def test_resume_must_with_no_checkpoint_that_verifies_fails_in_one_line(three):
    manager, _ = three
    for step in (1, 2, 3):
        _flip(manager.root / f"step_{step:08d}" / "trainer.pt")
    with pytest.warns(UserWarning), pytest.raises(ResumeError) as e:
        manager.resume(make_trainer(), mode="must", config=CONFIG)
    assert "none of the 3 checkpoints" in str(e.value) and "\n" not in str(e.value)


# -- a full disk -----------------------------------------------------------------------------
def test_full_disk_during_save_keeps_the_last_checkpoint(three, monkeypatch):
    manager, _ = three

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "trainer.pt")

    monkeypatch.setattr(checkpoint_module.torch, "save", enospc)
    with pytest.raises(
        CheckpointError, match="no space left on that disk.*resume from the last complete"
    ):
        manager.save(4, make_trainer(), config=CONFIG, data_state={"cursor": 4})
    assert sorted(p.name for p in manager.root.iterdir()) == [
        "step_00000001", "step_00000002", "step_00000003",
    ]  # fmt: skip


def test_full_disk_during_resume_keeps_metrics_and_says_so(tmp_path, straight, capsys):
    assert main(opts(tmp_path, **{"rl.max_steps": 3})) == 0
    before = (run_dir(tmp_path) / "metrics.jsonl").read_text()
    capsys.readouterr()
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp-" + str(os.getpid())):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    posttrain.fileio.os.fsync = fsync
    try:
        assert main(opts(tmp_path, **{"rl.max_steps": 4})) == 1
    finally:
        posttrain.fileio.os.fsync = real
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("posttrain: error: No space left on device"), err
    assert "free space" in err[-1] and "Traceback" not in "\n".join(err)
    assert (run_dir(tmp_path) / "metrics.jsonl").read_text() == before
    assert not [p for p in run_dir(tmp_path).iterdir() if ".tmp-" in p.name]
