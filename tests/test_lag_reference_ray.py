"""The KL reference on the data side under ``rl.off_policy_lag=1`` on Ray: its own actor scores
each batch in the pipeline's data thread, and the run is the policy-side run bit for bit; the
batches in flight carry its log-probs through a checkpoint (a resumed run continues exactly).

The session's Ray instance (tests/conftest.py): a tiny run with the reference as its own actor,
the same run with it inside the policy actor (a lag needs Ray), then the first resumed from its
step-2 checkpoint with the later one removed, as a run killed before its step-4 save would leave
it (tests/test_lag_reference.py has the rest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402

STEPS = 4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def train(root: Path, model: Path, where: str) -> dict:
    opts = {
        "job.output_root": str(root), "model.name_or_path": str(model),
        "data.train_size": 60, "data.val_size": 4, "data.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_tokens": 4, "reward.functions": "[role_fixtures:digit_reward]",
        "rl.grpo_surrogate": "clipped", "rl.kl_beta": 0.1, "rl.lr": 0.01, "rl.max_steps": STEPS,
        "rl.save_every": 2, "rl.eval_every": 0, "rl.micro_batch_size": 4,
        "logging.progress": False, "placement.backend": "ray", "placement.cpus_per_role": 0.5,
        "rl.off_policy_lag": 1, "placement.reference_on": where,
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("arithmetic", ["--", *opts])
    return grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)


def numbers(run: Path) -> tuple[list[dict], dict]:
    rows = [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    path = run / "checkpoints" / f"step_{STEPS:08d}" / "model" / "model.safetensors"
    return rows, load_file(str(path))


def test_the_data_side_reference_is_the_policy_sides_bit_for_bit_and_resumes(
    ray_cluster, tiny_dir, tmp_path
):
    # auto: the data side under a lag
    data = Path(train(tmp_path / "data", tiny_dir, "auto")["run_dir"])
    rows_d, weights_d = numbers(data)
    assert any("time/reference_s" in json.loads(line) for line in
               (data / "metrics.jsonl").read_text().splitlines())  # fmt: skip
    policy = Path(train(tmp_path / "policy", tiny_dir, "policy")["run_dir"])
    assert not any("time/reference_s" in json.loads(line) for line in
                   (policy / "metrics.jsonl").read_text().splitlines())  # fmt: skip
    rows_p, weights_p = numbers(policy)
    assert rows_d == rows_p and any(r.get("train/pg/kl_ref", 0) > 0 for r in rows_p)
    assert all(torch.equal(weights_d[k], weights_p[k]) for k in weights_p)
    # The run again from its step-2 checkpoint: the batch in flight there carries the
    # reference's log-probs (steps 3-4 train on it and the next one).
    ckpts = data / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000002", "step_00000004"]
    shutil.rmtree(ckpts / "step_00000004")
    resumed = train(tmp_path / "data", tiny_dir, "auto")  # as saved: a changed key is refused
    assert resumed["start_step"] == 2
    rows_r, weights_r = numbers(data)
    assert rows_r[-2:] == rows_d[-2:]
    assert all(torch.equal(weights_r[k], weights_d[k]) for k in weights_d)
