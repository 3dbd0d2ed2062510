"""rl.off_policy_lag=1 on a local 2-CPU Ray instance: the rollout samples ahead while the policy
trains, and the run still replays and resumes bit for bit.

Two runs of the arithmetic recipe with the clipped surrogate (so the importance correction is
read) on Ray: an in-process driver, and a CLI driver killed with SIGKILL after its step-3
checkpoint, then resumed in-process with ``rl.resume=auto``. Dynamic sampling is on, the reward
function fades out over four steps (``reward.functions_anneal_steps``), and a KL reference
resets to the policy every two steps (``rl.reference_reset_every=2``; under a lag ``auto`` keeps
a resetting reference on the policy actor). The step-3 checkpoint holds the reference of the
step-2 reset, no longer the policy, so the resume must restore it, not rebuild it. Every step
of the second run (1-3 from the killed driver, 4-6 from the resumed one) and its final weights
equal the first's: the lagged run replays and resumes bit for bit, across resets and the fade.
A k=0 run (in process: Ray equals in-process bit for bit, tests/test_placement_ray.py) shows the
lag changes the numbers (so the equalities can fail). OPD's teacher under a lag:
tests/test_opd_ray.py (beside the k=0 OPD run it compares with).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.testing import run_numbers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 6


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts_for(root: Path, model: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root), "model.name_or_path": str(model),
        "data.train_size": 60, "data.val_size": 4, "data.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_tokens": 3, "reward.functions": "[role_fixtures:slow_digit_reward]",
        "rl.grpo_surrogate": "clipped", "rl.lr": 0.01, "rl.max_steps": STEPS,
        "rl.save_every": 3, "rl.eval_every": 3, "rl.micro_batch_size": 4,
        "logging.progress": False, "placement.backend": "ray", "placement.cpus_per_role": 0.5,
        "rl.off_policy_lag": 1, "checkpoint.keep_last": 5, "rl.dynamic_sampling": True,
        "rl.max_sampling_rounds": 2, "rl.kl_beta": 0.1, "rl.reference_reset_every": 2,
        "reward.functions_anneal_steps": 4,
    }  # fmt: skip
    opts.update(extra)
    if opts["placement.backend"] == "local":  # the Ray knobs are refused there
        del opts["placement.cpus_per_role"]
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> dict:
    config = load_config("arithmetic", ["--", *opts])
    return grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)


def run_dir(root: Path) -> Path:
    return root / "grpo" / "arithmetic_tiny"


def rows(root: Path) -> list[dict]:
    text = (run_dir(root) / "metrics.jsonl").read_text()
    drop = ("time/", "perf/")
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(drop)}
        for line in text.splitlines()
    ]


def params(root: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    path = run_dir(root) / "checkpoints" / f"step_{step:08d}" / "model" / "model.safetensors"
    return load_file(str(path))


def same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def straight(ray_cluster, tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lag1")
    train(opts_for(root, tiny_dir))
    return root


def test_the_rollout_samples_one_step_behind_with_the_correction_on(straight):
    a = rows(straight)
    assert [r["step"] for r in a] == list(range(STEPS + 1))
    assert [r["train/reference/resets"] for r in a[1:]] == [0, 1, 1, 2, 2, 3]
    raw = (run_dir(straight) / "metrics.jsonl").read_text()
    assert "time/reference_s" not in raw  # scored on the policy side, by no data-side role
    staleness = [r["train/offpolicy/staleness"] for r in a[1:]]
    assert staleness == [0.0] + [1.0] * (STEPS - 1)
    # The correction is on by default under a lag and sees a real sampler-trainer gap.
    assert all(r["train/rollout/logprob_abs_diff"] > 0 for r in a[2:])
    assert all(0 < r["train/rollout/is_weight_max"] <= 2.0 for r in a[1:])
    assert all(0 <= r["train/rollout/is_truncated_frac"] < 1 for r in a[1:])
    # The reward function fades out over 4 steps, each step scored with its own weight.
    weights = [r["train/reward_functions_weight"] for r in a[1:]]
    assert weights == pytest.approx([1, 0.75, 0.5, 0.25, 0, 0], abs=1e-15)
    # In flight: the checkpoint after step 3 holds step 4's batch, sampled with step 2's weights.
    ckpt = run_dir(straight) / "checkpoints" / "step_00000003" / "data_state.pt"
    state = torch.load(ckpt, weights_only=True)
    assert [c["step"] for c in state["in_flight"]] == [4] and state["in_flight"][0]["version"] == 2


def test_the_lag_changes_the_run_from_step_2_on(straight, tiny_dir, tmp_path):
    """Step 1 trains on the same batch (initial weights) either way; step 2's batch is sampled
    with the weights after step 1 without a lag, with the initial ones under it."""
    k0 = {"rl.off_policy_lag": 0, "rl.rollout_is_cap": 2.0, "placement.backend": "local"}
    train(opts_for(tmp_path, tiny_dir, **k0))
    lagged, sequential = run_numbers(rows(straight)), run_numbers(rows(tmp_path))
    del lagged[1]["train/offpolicy/staleness"]
    assert lagged[1] == sequential[1]
    assert lagged[2] != sequential[2]
    assert not same_params(params(straight), params(tmp_path))


def test_kill_9_then_resume_auto_replays_and_continues_bit_exactly(
    straight, ray_cluster, tiny_dir, tmp_path
):
    opts = opts_for(tmp_path, tiny_dir, **{"placement.ray_address": ray_cluster})
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    driver = subprocess.Popen([*cmd, *opts], cwd=tmp_path, env={**env, "LAG_TEST_SLOW_REWARD": "1"},
                              text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    ckpts = run_dir(tmp_path) / "checkpoints"
    deadline = time.monotonic() + 180
    while not (ckpts / "step_00000003" / "COMPLETE").exists():
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never reached its step-3 checkpoint"
        time.sleep(0.02)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    assert not (ckpts / f"step_{STEPS:08d}" / "COMPLETE").exists(), "killed too late"
    # Resumed in this process (a CLI resume with rl.resume=auto: tests/test_fsdp_ray.py).
    resumed = train([*opts_for(tmp_path, tiny_dir), "rl.resume=auto"])
    assert resumed["start_step"] == 3 and Path(resumed["run_dir"]) == run_dir(tmp_path)
    assert same_params(params(straight), params(tmp_path))
    a = {r["step"]: r for r in rows(straight)}
    b = {r["step"]: r for r in rows(tmp_path)}  # the resumed steps overwrite the killed ones
    # Steps 0-3 replay the in-process run in the killed driver, 4-6 continue it after the kill.
    assert sorted(a) == sorted(b) == list(range(STEPS + 1))
    assert all(a[s] == b[s] for s in range(STEPS + 1))
