"""rollout.engine=vllm on a Ray rollout actor: OPD on a multi-turn environment, on the data side
of rl.off_policy_lag=1.

The rollout role's actor starts the vLLM process itself (the same child process as under local
placement) and takes the policy's full weights after every update through Ray; the
environments run in the reward actor, and each turn's context goes to vLLM as the trajectory's
ids. Where a step samples with the weights the trainer scores π_old with, vLLM's log-probs equal
the trainer's forward within the float32 bound of tests/test_vllm_engine.py; under the lag later
steps were sampled one update earlier (staleness 1) and the gap is the policy's own change,
which the importance weight corrects. No vLLM process outlives a run (Ray ends actors without
their atexit). Kept to one short run (GRPO with vLLM is tests/test_vllm_engine.py's, on Ray
without vLLM tests/test_off_policy_lag_ray.py's): Ray actors and a vLLM start are most of its
time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from multiturn_fixtures import build_tools_model  # noqa: E402
from test_vllm_engine import LOGPROB_BOUND, _need_vllm, vllm_processes  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.entrypoints import opd  # noqa: E402
from posttrain.model.loading import load_policy  # noqa: E402

#: A multi-turn run on the tools model (head size 32: vLLM's CPU attention takes it), on Ray.
MULTI_TURN = {
    "data.train_size": 16, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
    "rollout.max_tokens": 6, "rl.max_steps": 3, "rl.save_every": 3, "rl.eval_every": 3,
    "rl.micro_batch_size": 8, "logging.progress": False, "rollout.engine": "vllm",
    "rollout.dtype": "float32", "placement.backend": "ray", "placement.cpus_per_role": 0.5,
    "env.name": "role_fixtures:chatty", "env.max_turns": 3, "env.max_context": 120,
}  # fmt: skip


def _orphaned_vllm() -> set[int]:
    """vLLM processes whose parent is gone (re-parented to init; no subreaper is set here): a
    rollout actor ended by ray.kill left its vLLM worker's group behind before the run closed
    the role first."""
    return vllm_processes(1)


def _run(entry, recipe: str, opts: dict) -> list[dict]:
    """Run ``entry`` on ``recipe`` with ``opts``; its metrics rows, once no vLLM process of the
    run is left."""
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config(recipe, ["--", *opts])
    assert config.rl.rollout_is_cap == 2.0  # on by default with this engine
    orphans = _orphaned_vllm()
    summary = entry.run(config, recipe, opts, entry.default_out_dir(config))
    deadline = time.monotonic() + 30  # the run closes its rollout role's engine
    while _orphaned_vllm() - orphans and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _orphaned_vllm() - orphans, "vLLM's processes outlived the run's rollout actor"
    return [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").open()]


def test_a_lagged_multi_turn_opd_run_on_ray_samples_with_vllm_on_the_data_side(
    tmp_path, ray_cluster
):
    """OPD (a teacher actor scoring the student's samples) on a multi-turn environment with
    rl.off_policy_lag=1: step 1 is sampled with the weights π_old is scored with, so the
    trainer's forward of the whole trajectories agrees with vLLM's log-probs within the bound;
    later steps were sampled one update earlier and the gap is the policy's own change. Every
    step's sync sends the full weights; no vLLM process outlives the run."""
    _need_vllm()
    student = build_tools_model(tmp_path / "student", heads=1)
    teacher = build_tools_model(tmp_path / "teacher", seed=1, heads=1)
    rows = _run(opd, "opd_arithmetic", {
        **MULTI_TURN, "job.output_root": tmp_path / "out", "model.name_or_path": student,
        "teacher.name_or_path": teacher, "rl.distillation_mode": "advantage",
        "rl.off_policy_lag": 1, "rl.lr": 0.01,
    })  # fmt: skip
    steps = [r for r in rows if "train/opd/reverse_kl" in r]
    assert [r["train/offpolicy/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    assert all(r["train/env/turns_mean"] > 1 and r["train/env/env_tokens_mean"] > 0 for r in steps)
    gaps = [r["train/rollout/logprob_abs_diff_max"] for r in steps]
    print(f"multi-turn OPD with vLLM on a Ray rollout actor, lag 1: logprob_abs_diff_max {gaps}")
    assert 0 <= gaps[0] <= LOGPROB_BOUND  # sampled with the weights π_old is scored with
    assert all(g > 100 * LOGPROB_BOUND for g in gaps[1:])  # a step older: the policy moved
    full = sum(p.numel() * 4 for p in load_policy(student)[0].parameters())
    assert all(r["sync/bytes"] == full for r in steps)
    assert "val/env/turns_mean" in rows[-1]
