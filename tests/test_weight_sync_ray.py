"""Bucketed weight sync on Ray: one unsharded policy rank, and two FSDP-sharded gloo ranks (with
and without LoRA), send their weights to the rollout actor in many small buckets, and the rollout
ends up with, bit for bit, the weights the one-piece sync sent (the policy's state dict; a
sharded policy's gathered full state dict, LoRA merged in)."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("peft")

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.placement.ray import place_ray  # noqa: E402
from posttrain.testing import synthetic_batch  # noqa: E402

LORA = ["model.lora_rank=4", "model.lora_alpha=8", "model.lora_target_modules=[q_proj,v_proj]"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def todays_weights(host) -> dict[str, torch.Tensor]:
    """What the one-piece sync sent, computed inside a policy actor (every rank when sharded)."""
    from posttrain.model.lora import is_lora, merged_state
    from posttrain.trainer.dcp import gathered_weights

    model = host.role.model
    if host.role.trainer.sharded:
        return gathered_weights(model)
    state = merged_state(model) if is_lora(model) else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def rollout_weights(host) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in host.role.engine.model.state_dict().items()}


@pytest.mark.parametrize(
    "sharding, ranks, extra",
    [("none", 1, []), ("fsdp", 2, []), ("fsdp", 2, LORA)],
    ids=["unsharded", "fsdp", "fsdp-lora"],
)
def test_bucketed_sync_gives_the_rollout_todays_weights(
    ray_cluster, tiny, tmp_path, sharding, ranks, extra
):
    opts = [f"model.name_or_path={tiny}", f"job.output_root={tmp_path}",
            "placement.backend=ray", "placement.cpus_per_role=0.5", f"placement.policy_ranks={ranks}",
            f"placement.policy_sharding={sharding}", "placement.sync_bucket_mb=0.02",
            "rl.lr=0.01", *extra]  # fmt: skip
    config = load_config("arithmetic", ["--", *opts])
    roles = place_ray(config, "arithmetic", opts, build_objective, str(tmp_path / "run"))
    try:
        vocab = 99  # the tiny preset's characters and specials
        roles.policy.train(synthetic_batch(vocab, 8, seed=3))  # weights the rollout lacks
        assert roles.sync_weights() == 1
        handles = roles.actors.handles
        ranks = roles.policy.names if sharding == "fsdp" else roles.policy.names[:1]
        want = ray.get([handles[n].__ray_call__.remote(todays_weights) for n in ranks])[0]
        got = ray.get(handles["rollout"].__ray_call__.remote(rollout_weights))
    finally:
        roles.close()
    assert got.keys() <= want.keys()
    for name, value in got.items():
        assert torch.equal(value, want[name]), name
    sent = roles.last_sync
    if extra:  # the adapters only: 3 layers x (q, v) x (A, B)
        assert sent["sync/tensors"] == 12 and sent["sync/bytes"] < 40_000
    else:
        assert sent["sync/buckets"] > 4 and sent["sync/bytes"] == 407_424
