"""Reruns of a run directory through the CLI at its edges (issue 33): a resumed run's summary
still says where the run began, and a finished run whose final checkpoint is damaged falls back
to the one before it and retrains the missing step, bit for bit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.model.tiny import build_tiny_model
from posttrain.trainer.manifest import verify

REPO = Path(__file__).resolve().parents[1]
RUN = Path("grpo") / "edges"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def grpo(cwd: Path, tiny: Path, steps: int) -> subprocess.CompletedProcess:
    opts = {
        "job.name": "edges", "job.output_root": str(cwd), "model.name_or_path": str(tiny),
        "data.train_size": 40, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
        "rollout.max_tokens": 3, "rl.lr": 0.01, "rl.max_steps": steps, "rl.save_every": 1,
        "rl.eval_every": 2, "rl.micro_batch_size": 8, "logging.progress": False,
        "reward.functions": "[role_fixtures:digit_reward]",
    }  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    return subprocess.run([*cmd, *(f"{k}={v}" for k, v in opts.items())], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def accuracy_line(out: str) -> tuple[str, str]:
    m = re.search(r"held-out accuracy: (\S+) -> (\S+) ", out)
    assert m, out
    return m.group(1), m.group(2)


@pytest.fixture(scope="module")
def run(tiny, tmp_path_factory):
    """Two steps, then the same run continued to a third."""
    cwd = tmp_path_factory.mktemp("run")
    first = grpo(cwd, tiny, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = grpo(cwd, tiny, 3)
    assert second.returncode == 0, second.stderr[-3000:]
    return cwd, first, second


def test_a_resumed_run_reports_the_held_out_accuracy_of_step_0_from_its_history(run):
    _, first, second = run
    assert "resuming from step 2" in second.stderr
    before, _ = accuracy_line(first.stdout)
    assert accuracy_line(second.stdout)[0] == before != "-"


def test_a_damaged_final_checkpoint_of_a_finished_run_falls_back_and_retrains(run, tiny):
    cwd, _, _ = run
    ckpts = cwd / RUN / "checkpoints"
    final = ckpts / "step_00000003"
    weights = final / "model" / "model.safetensors"
    good = weights.read_bytes()
    os.unlink(weights)  # not in place: final_model/ holds a hard link to the same bytes
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    again = grpo(cwd, tiny, 3)
    assert again.returncode == 0, again.stderr[-3000:]
    err = again.stderr
    assert "does not match its SHA-256" in err and "moved the damaged checkpoint" in err, err
    assert (ckpts / ".corrupt-step_00000003" / "model" / "model.safetensors").exists()
    assert "resuming from step 2" in err and "trained 1 steps" in again.stdout
    verify(final, 3)
    assert weights.read_bytes() == good  # the retrained step is the step that was lost
    assert (cwd / RUN / "final_model" / "model.safetensors").read_bytes() == good
    done = grpo(cwd, tiny, 3)  # and now it is a finished run again
    assert done.returncode == 0 and "already complete at step 3" in done.stdout, done.stderr
