"""Preflight for ``rl.reference_reset_every`` where the reference lives (the knob itself is read
only with a KL reference: ``control/reads.py`` refuses it otherwise, from the objectives' reads)."""

from __future__ import annotations

from posttrain.config.build import needs_reference
from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error


@error("rl.reference_reset_every", "placement.policy_sharding", "model.lora_rank")
def reset_with_sharded_adapters(cfg: PosttrainConfig) -> str | None:
    """A LoRA reset scores the policy's module with frozen adapters swapped in by
    ``functional_call``; FSDP gathers a layer's own shards, so a swapped-in tensor is not read.
    (A full-fine-tuning reference is sharded like the policy and resets shard by shard.)"""
    n = cfg.rl.reference_reset_every
    sharded = cfg.placement.policy_sharding == "fsdp"
    if not n or not needs_reference(cfg) or not sharded or not cfg.model.lora_rank:
        return None
    return (
        f"rl.reference_reset_every={n} with model.lora_rank={cfg.model.lora_rank} is not "
        "supported with placement.policy_sharding=fsdp (the frozen adapters cannot be swapped "
        "into sharded layers); set placement.policy_sharding=none, model.lora_rank=0 or "
        "rl.reference_reset_every=0"
    )


@error("rl.reference_reset_every", "placement.reference_on")
def reset_with_a_data_side_reference(cfg: PosttrainConfig) -> str | None:
    """A reset copies the policy's weights into the reference: it scores on the policy side."""
    n = cfg.rl.reference_reset_every
    if not n or not needs_reference(cfg) or cfg.placement.reference_on != "data":
        return None
    return (
        f"rl.reference_reset_every={n} needs the reference on the policy side (a reset copies "
        "the policy's weights into it); set placement.reference_on=auto or policy"
    )


RULES = (reset_with_sharded_adapters, reset_with_a_data_side_reference)
