"""Preflight for DPO on language models: its pairs file, the micro-batching that keeps each pair
whole, a reference that computes as the policy does. (What it refuses as a policy-only entry,
that only it reads the ``lmdpo`` section, and that a step needs a pair for each policy rank, is
derived from the entry registry: ``control/entries.py``.)"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error, objective_family


def _ours(cfg: PosttrainConfig) -> bool:
    return objective_family(cfg) == "lmdpo"


@error("job.algorithm", "lmdpo.train_path")
def lmdpo_needs_train_path(cfg: PosttrainConfig) -> str | None:
    """DPO has no other data source than its pairs."""
    if not _ours(cfg) or cfg.lmdpo.train_path is not None:
        return None
    return (
        "lmdpo.train_path is not set; point it at a JSONL file of preference pairs "
        "(prompt or messages, chosen, rejected; docs/guides/preference.md)"
    )


@error("rl.micro_batch_size", "rl.shared_prefix")
def pairs_stay_whole(cfg: PosttrainConfig) -> str | None:
    """A pair's loss needs its chosen and its rejected in one micro-batch: the trainer keeps a
    group (a pair) whole only when rows may be regrouped, and a micro-batch holds two rows."""
    if not _ours(cfg):
        return None
    if cfg.rl.shared_prefix == "off":
        return (
            "rl.shared_prefix=off: the trainer would cut micro-batches through preference "
            "pairs; set rl.shared_prefix=auto (each pair is kept in one micro-batch)"
        )
    if cfg.rl.micro_batch_tokens is None and cfg.rl.micro_batch_size < 2:
        return (
            f"rl.micro_batch_size={cfg.rl.micro_batch_size}: a preference pair is two rows; "
            "set rl.micro_batch_size >= 2"
        )
    return None


@error("placement.policy_sharding", "model.dtype", "model.lora_rank")
def sharded_bf16_reference_needs_lora(cfg: PosttrainConfig) -> str | None:
    """Without LoRA each rank scores a whole float32 copy of the base as its reference, under
    the update's autocast; a sharded policy computes in bf16 through FSDP's mixed-precision
    policy instead, so an unchanged policy would not score as its reference (Δ = 0 fails)."""
    if not _ours(cfg) or cfg.placement.policy_sharding != "fsdp" or cfg.model.lora_rank:
        return None
    if cfg.model.dtype != "bfloat16":
        return None
    return (
        "placement.policy_sharding=fsdp with model.dtype=bfloat16 and no LoRA: the reference "
        "copy would compute otherwise than the sharded policy; set model.lora_rank (the "
        "reference is then the policy with its adapters off) or model.dtype=float32"
    )


RULES = (lmdpo_needs_train_path, pairs_stay_whole, sharded_bf16_reference_needs_lora)
