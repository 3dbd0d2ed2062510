"""Kill -9 a training process mid-save, resume it, and get bit-identical results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "scripts" / "resume_worker.py"
STEPS, SAVE_EVERY = 6, 3


def launch(root, log, resume, *extra):
    args = [sys.executable, str(SCRIPT), str(root), str(log), str(STEPS), str(SAVE_EVERY), resume]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*args, *map(str, extra)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_log(path: Path) -> dict[int, list[float]]:
    return {e["step"]: e["losses"] for e in map(json.loads, path.read_text().splitlines())}


def assert_same_tree(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_kill_during_save_then_resume_is_bit_exact(tmp_path):
    straight = launch(tmp_path / "a", tmp_path / "a.log", "off")
    killed_root = tmp_path / "b"
    killed = launch(killed_root, tmp_path / "b.log", "off", STEPS)  # hangs inside the step-6 save
    marker = Path(f"{killed_root}.hanging")
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert killed.poll() is None, killed.communicate()[1]
        assert time.monotonic() < deadline, "worker never reached the step-6 save"
        time.sleep(0.05)
    assert (killed_root / "step_00000003" / "COMPLETE").exists()
    assert (killed_root / ".tmp-step_00000006" / "model").exists()  # half-written
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    _, err = straight.communicate(timeout=120)
    assert straight.returncode == 0, err

    resumed = launch(killed_root, tmp_path / "c.log", "auto")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert "removing half-written checkpoint" in err

    a, b, c = (read_log(tmp_path / f"{x}.log") for x in "abc")
    assert sorted(a) == list(range(1, STEPS + 1)) and sorted(c) == [4, 5, 6]
    assert {**{s: b[s] for s in (1, 2, 3)}, **c} == a  # logged losses identical
    assert {s: b[s] for s in (4, 5, 6)} == c  # the killed run had got there too

    final_a, final_c = tmp_path / "a" / "step_00000006", killed_root / "step_00000006"
    assert_same_tree(
        load_file(final_a / "model" / "model.safetensors"),
        load_file(final_c / "model" / "model.safetensors"),
        "model",
    )
    trainer_a = torch.load(final_a / "trainer.pt", weights_only=True)
    trainer_c = torch.load(final_c / "trainer.pt", weights_only=True)
    assert trainer_a["optimizer"]["state"]  # AdamW moments are there to compare
    assert_same_tree(trainer_a, trainer_c, "trainer")
    assert_same_tree(
        torch.load(final_a / "rng_rank0.pt", weights_only=True),
        torch.load(final_c / "rng_rank0.pt", weights_only=True),
        "rng",
    )
    assert sorted(p.name for p in killed_root.iterdir()) == ["step_00000003", "step_00000006"]
