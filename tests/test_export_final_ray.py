"""A run on two FSDP Ray ranks (rank 1 loads a meta-device skeleton) ends with
``RUN_DIR/final_model``: a folder ``from_pretrained`` loads whose weights are the final sharded
checkpoint's, bit for bit (read back independently with DCP's own converter)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")

from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.run.records import FINAL_DIR  # noqa: E402


def digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    return float(sum(c.isdigit() for c in completion))


def test_a_sharded_run_ends_with_its_final_shards_as_a_hugging_face_folder(ray_cluster, tmp_path):
    tiny = build_tiny_model("tiny", tmp_path / "tiny", seed=0)
    opts = {
        "job.output_root": str(tmp_path / "out"), "model.name_or_path": str(tiny),
        "data.train_size": 40, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
        "rollout.max_tokens": 3, "reward.functions": "[test_export_final_ray:digit_reward]",
        "rl.lr": 0.01, "rl.max_steps": 2, "rl.save_every": 0, "rl.eval_every": 0,
        "rl.micro_batch_size": 8, "logging.progress": False, "placement.backend": "ray",
        "placement.cpus_per_role": 0.5, "placement.policy_ranks": 2,
        "placement.policy_sharding": "fsdp",
    }  # fmt: skip
    args = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("arithmetic", ["--", *args])
    summary = grpo.run(config, "arithmetic", args, grpo.default_out_dir(config), build_objective)
    run_dir = Path(summary["run_dir"])
    assert summary["final_model"] == str(run_dir / FINAL_DIR)
    ckpt = run_dir / "checkpoints" / "step_00000002"
    dcp_to_torch_save(ckpt / "dcp", tmp_path / "full.pt")
    shards = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
    got = AutoModelForCausalLM.from_pretrained(run_dir / FINAL_DIR, local_files_only=True)
    state = got.state_dict()
    assert set(shards) <= set(state)
    for k, v in shards.items():
        assert torch.equal(state[k], v), k
    initial = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in shards.items())  # it trained
