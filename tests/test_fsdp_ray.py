"""FSDP policy ranks through the Ray entry: the arithmetic recipe for three steps in-process
(one unsharded rank) and on Ray with two FSDP ranks give the same run (to float rounding), and
the sharded checkpoint the run wrote exports to a folder ``from_pretrained`` loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.trainer.dcp import export_hf  # noqa: E402

STEPS = 3
FSDP = {
    "placement.backend": "ray",
    "placement.cpus_per_role": 0.5,
    "placement.policy_ranks": 2,
    "placement.policy_sharding": "fsdp",
}


def digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    return float(sum(c.isdigit() for c in completion))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tiny = build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)
    root = tmp_path_factory.mktemp("runs")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    try:
        out = {}
        for name, extra in [("local", {}), ("fsdp2", FSDP)]:
            opts = {
                "job.output_root": str(root / name),
                "model.name_or_path": str(tiny),
                "data.train_size": 60,
                "data.val_size": 4,
                "data.prompts_per_step": 4,
                "rollout.n": 4,
                "rollout.max_tokens": 3,
                "reward.functions": "[test_fsdp_ray:digit_reward]",
                "rl.lr": 0.01,
                "rl.max_steps": STEPS,
                "rl.save_every": STEPS,
                "rl.eval_every": 0,
                # 5 rows a rank in one micro-batch and 3 in the other: ranks run unequal
                # numbers of micro-batches, so the lockstep padding is exercised.
                "rl.micro_batch_size": 3,
                "rl.mini_batch_per_replica": 2,
                "logging.progress": False,
                **extra,
            }
            opts = [f"{k}={v}" for k, v in opts.items()]
            config = load_config("arithmetic", ["--", *opts])
            out[name] = grpo.run(
                config, "arithmetic", opts, grpo.default_out_dir(config), build_objective
            )
    finally:
        ray.shutdown()
    return tiny, out


def rows_of(summary: dict) -> list[dict]:
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def ckpt(summary: dict) -> Path:
    return Path(summary["run_dir"]) / "checkpoints" / f"step_{STEPS:08d}"


def test_two_fsdp_ranks_make_the_single_rank_run(runs, tmp_path):
    tiny, out = runs
    a, b = rows_of(out["local"]), rows_of(out["fsdp2"])
    assert len(a) == len(b) == STEPS
    for ra, rb in zip(a, b, strict=True):
        assert ra["train/reward_mean"] == rb["train/reward_mean"]  # same samples
        # GRPO's loss is a cancelling sum (advantages have zero mean in each group), so it is
        # compared absolutely, at the scale of one token's term (|ratio * advantage| ~ 1).
        assert rb["train/loss"] == pytest.approx(ra["train/loss"], rel=0, abs=1e-6)
        assert rb["train/grad_norm"] == pytest.approx(ra["train/grad_norm"], rel=1e-6)
        assert rb["train/samples"] == ra["train/samples"]
    sharded = ckpt(out["fsdp2"])
    assert {p.name for p in (sharded / "dcp").iterdir()} >= {"__0_0.distcp", "__1_0.distcp"}
    assert not (sharded / "model" / "model.safetensors").exists()
    exported = export_hf(sharded, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).state_dict()
    want = load_file(str(ckpt(out["local"]) / "model" / "model.safetensors"))
    initial = load_file(str(tiny / "model.safetensors"))
    for k, w in want.items():
        rel = float((got[k] - w).norm() / w.norm())
        assert rel <= 1e-6, (k, rel)
    assert max(float((want[k] - initial[k]).abs().max()) for k in want) > 1e-3  # it trained
