"""Resume across placements through the CLI (issue 33): the rank count, the sharding and the
backend are where a run's steps execute, not what it is, so one run directory is continued a
step at a time on 2 FSDP Ray ranks, 1, one local process and 2 replicated Ray ranks (each
command resumes and trains its step once: sharded 2 -> 1 -> unsharded -> replicated); a replicated
checkpoint into sharded ranks, the one combination the checkpoint formats cannot load, is
refused in one line naming the fix, and nothing in the run directory changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

from posttrain.model.tiny import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN = Path("grpo") / "reshard"
FSDP = {"placement.backend": "ray", "placement.policy_sharding": "fsdp"}
REPLICATED = {"placement.backend": "ray"}
LOCAL = {"placement.backend": "local"}  # the Ray knobs are refused there: left at defaults
#: (placement, ranks) of each command; command k trains step k + 2 (the first trains 1-2).
PLACEMENTS = [(FSDP, 2), (FSDP, 1), (LOCAL, 1), (REPLICATED, 2)]


def digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    return float(sum(c.isdigit() for c in completion))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def grpo(cwd: Path, tiny: Path, ray: str, steps: int, placement: dict, ranks: int):
    opts = {
        "job.name": "reshard", "job.output_root": str(cwd), "model.name_or_path": str(tiny),
        "data.train_size": 60, "data.val_size": 4, "data.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_tokens": 3, "reward.functions": "[test_resume_reshard:digit_reward]",
        "rl.lr": 0.01, "rl.max_steps": steps, "rl.save_every": 1, "rl.eval_every": 0,
        "checkpoint.keep_last": 10,
        "rl.micro_batch_size": 3, "rl.mini_batch_per_replica": 2, "logging.progress": False,
        **placement,
    }  # fmt: skip
    if placement["placement.backend"] == "ray":
        opts |= {"placement.cpus_per_role": 0.5, "placement.ray_address": ray,
                 "placement.policy_ranks": ranks}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    return subprocess.run([*cmd, *(f"{k}={v}" for k, v in opts.items())], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def resumed(ray_cluster, tiny, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reshard")
    runs = []
    for k, (placement, ranks) in enumerate(PLACEMENTS):
        run = grpo(cwd, tiny, ray_cluster, k + 2, placement, ranks)
        assert run.returncode == 0, f"command {k} ({placement}, {ranks}):\n{run.stderr[-4000:]}"
        runs.append(run)
    return cwd, tiny, runs


def test_each_placement_resumes_the_last_and_trains_its_step_once(resumed):
    cwd, _, runs = resumed
    for k, run in enumerate(runs[1:], 1):
        assert f"resuming from step {k + 1}" in run.stderr, run.stderr[-3000:]
        assert "trained 1 steps" in run.stdout, run.stdout
    rows = [json.loads(x) for x in (cwd / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(PLACEMENTS) + 2))
    ckpts = cwd / RUN / "checkpoints"
    assert (ckpts / "step_00000002" / "dcp").is_dir()  # the sharded formats were really used
    assert not (ckpts / "step_00000005" / "dcp").exists()


def test_a_changed_rank_count_warns_that_rounding_may_differ(resumed):
    _, _, runs = resumed
    line = "placement.policy_ranks changed from 2 to 1: the gradient is summed over"
    assert line in runs[1].stderr, runs[1].stderr[-3000:]


def test_a_replicated_checkpoint_into_sharded_ranks_is_refused_in_one_line(resumed, ray_cluster):
    cwd, tiny, _ = resumed
    before = sorted(p.name for p in (cwd / RUN).rglob("*"))
    refused = grpo(cwd, tiny, ray_cluster, len(PLACEMENTS) + 2, FSDP, 2)
    err = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert err.startswith("posttrain: error: ResumeError: ") and "cannot be resharded" in err
    assert "step_00000005 is a replicated checkpoint" in err, err
    assert "resume it with placement.policy_sharding=none" in err
    assert sorted(p.name for p in (cwd / RUN).rglob("*")) == before
