"""rollout.engine=vllm on a Ray rollout actor, on the data side of rl.off_policy_lag=1.

The rollout role's actor starts the vLLM process itself (the same child process as under local
placement) and takes the policy's full weights after every update through Ray. Step 1 samples
with the weights the trainer scores π_old with, so vLLM's log-probs equal the trainer's forward
within the float32 bound of tests/test_vllm_engine.py; later steps were sampled one update
earlier (staleness 1) and the gap is the policy's own change, which the importance weight
corrects. No vLLM process outlives the run (Ray ends actors without their atexit). Kept to one
short run: a Ray actor and a vLLM start are most of its time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from test_vllm_engine import (  # noqa: E402
    LOGPROB_BOUND,
    _need_vllm,
    build_model_dir,
    vllm_processes,
)

from posttrain.config import load_config  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.loading import load_policy  # noqa: E402


def _orphaned_vllm() -> set[int]:
    """vLLM processes whose parent is gone (re-parented to init; no subreaper is set here): a
    rollout actor ended by ray.kill left its vLLM worker's group behind before the run closed
    the role first."""
    return vllm_processes(1)


def test_a_lagged_ray_run_samples_with_vllm_on_the_data_side(tmp_path, ray_cluster):
    _need_vllm()
    folder = build_model_dir(tmp_path / "model", seed=0)
    opts = [
        f"job.output_root={tmp_path / 'out'}", f"model.name_or_path={folder}",
        "rollout.engine=vllm", "rollout.dtype=float32", "rl.grpo_surrogate=clipped",
        "placement.backend=ray", "placement.cpus_per_role=0.5", "rl.off_policy_lag=1",
        "data.train_size=40", "data.val_size=4",
        "data.prompts_per_step=4", "rollout.n=4", "rollout.max_tokens=4", "rl.max_steps=3",
        "rl.save_every=3", "rl.eval_every=3", "rl.micro_batch_size=8", "logging.progress=false",
        "rl.lr=0.01", "rl.entropy_coef=0.1",  # a gradient whatever the rewards
    ]  # fmt: skip
    config = load_config("arithmetic", ["--", *opts])
    orphans = _orphaned_vllm()
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config))
    deadline = time.monotonic() + 30  # the run closes its rollout role's engine
    while _orphaned_vllm() - orphans and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _orphaned_vllm() - orphans, "vLLM's processes outlived the run's rollout actor"
    rows = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["train/offpolicy/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    gaps = [r["train/rollout/logprob_abs_diff_max"] for r in steps]
    print(f"vLLM on a Ray rollout actor, lag 1: logprob_abs_diff_max {gaps}")
    assert gaps[0] <= LOGPROB_BOUND  # sampled with the weights π_old is scored with
    assert all(g > 100 * LOGPROB_BOUND for g in gaps[1:])  # a step older: the policy moved
    full = sum(p.numel() * 4 for p in load_policy(folder)[0].parameters())
    assert all(r["sync/bytes"] == full for r in steps)
    assert "val/accuracy" in rows[-1]
