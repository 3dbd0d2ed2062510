"""Issue 24 item 9: a full disk or a deleted checkpoints/ during a save is one line, exit 1."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
sys.path.insert(0, str(Path(__file__).parent))
from test_checkpoint import CONFIG, make_trainer, train_step

from posttrain.run.guard import run_guarded
from posttrain.trainer import CheckpointError, CheckpointManager, checkpoint, save_errors
from posttrain.trainer.manifest import verify


def _manager(root: Path):
    trainer = make_trainer()
    train_step(trainer, 0)
    manager = CheckpointManager(root, keep_last=3)
    first = manager.save(1, trainer, config=CONFIG)
    return trainer, manager, first


def _one_line(capsys, fn) -> str:
    assert run_guarded(fn) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def small_disk(tmp_path):
    """A 600 KiB tmpfs (room for one tiny checkpoint and a half); needs root and mount."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(where)],
                          capture_output=True)  # fmt: skip
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        gc.collect()  # a failed writer may still hold its file open until collected
        subprocess.run(["umount", "--lazy", str(where)], check=True)


@pytest.mark.parametrize("leave", [1_000, 20_000, 40_000])  # torch's and safetensors' errors
def test_full_disk_during_a_save_is_one_line(small_disk, capsys, leave):
    trainer, manager, first = _manager(small_disk / "ckpt")
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"x" * (free - leave))
    err = _one_line(capsys, lambda: manager.save(2, trainer, config=CONFIG))
    assert "checkpoint step 2 could not be saved" in err and "no space left on that disk" in err
    verify(first, 1)  # the earlier checkpoint is intact
    assert sorted(p.name for p in (small_disk / "ckpt").iterdir()) == ["step_00000001"]


@pytest.mark.parametrize(
    "error",
    [
        "SafetensorError: Error while serializing: I/O error: Input/output error (os error 5)",
        "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 918",
    ],
)
def test_library_write_errors_become_one_line(tmp_path, capsys, monkeypatch, error):
    trainer, manager, first = _manager(tmp_path / "ckpt")
    kind, text = error.split(": ", 1)
    cls = type(kind, (Exception,), {})  # named as the library's own type

    def fail(*args, **kwargs):
        raise cls(text)

    monkeypatch.setattr(checkpoint, "save_model_dir", fail)
    monkeypatch.setattr(save_errors, "_FULL_DISK_BYTES", 0)  # plenty of space: not a full disk
    err = _one_line(capsys, lambda: manager.save(2, trainer, config=CONFIG))
    assert f"could not write checkpoint step 2 to {tmp_path / 'ckpt' / 'step_00000002'}" in err
    assert f"({kind}: {text}); check that disk and rerun" in err
    verify(first, 1)
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))


def test_a_library_error_saying_no_space_is_a_full_disk(tmp_path, capsys, monkeypatch):
    trainer, manager, first = _manager(tmp_path / "ckpt")
    SafetensorError = type("SafetensorError", (Exception,), {})

    def fail(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(checkpoint, "save_model_dir", fail)
    err = _one_line(capsys, lambda: manager.save(2, trainer, config=CONFIG))
    assert "no space left on that disk; free space there (or lower checkpoint.keep_last)" in err
    verify(first, 1)


def test_checkpoints_deleted_during_a_save_is_one_line(tmp_path, capsys, monkeypatch):
    trainer, manager, _ = _manager(tmp_path / "ckpt")
    real = checkpoint.save_model_dir

    def save_then_delete(*args, **kwargs):
        real(*args, **kwargs)
        shutil.rmtree(tmp_path / "ckpt")  # a user's rm -rf checkpoints/ mid-save

    monkeypatch.setattr(checkpoint, "save_model_dir", save_then_delete)
    err = _one_line(capsys, lambda: manager.save(2, trainer, config=CONFIG))
    assert f"{tmp_path / 'ckpt'} was removed while it was being written" in err


def test_other_failures_keep_their_type(tmp_path, monkeypatch):
    trainer, manager, _ = _manager(tmp_path / "ckpt")

    def bug(*args, **kwargs):
        raise TypeError("a bug, not the disk")

    monkeypatch.setattr(checkpoint, "save_model_dir", bug)
    with pytest.raises(TypeError, match="a bug"):
        manager.save(2, trainer, config=CONFIG)
    assert not isinstance(TypeError(), CheckpointError)


def test_a_runtime_error_that_is_not_a_write_failure_keeps_its_type(tmp_path, monkeypatch):
    """Only a library error that says it failed writing is blamed on the disk."""
    trainer, manager, _ = _manager(tmp_path / "ckpt")

    def bug(*args, **kwargs):
        raise RuntimeError("size mismatch for a tensor: a bug, not the disk")

    monkeypatch.setattr(checkpoint, "save_model_dir", bug)
    with pytest.raises(RuntimeError, match="size mismatch") as info:
        manager.save(2, trainer, config=CONFIG)
    assert not isinstance(info.value, CheckpointError)
