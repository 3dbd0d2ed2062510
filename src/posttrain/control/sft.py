"""Preflight for supervised fine-tuning: its data file, and the placements it runs on. (What it
refuses as a policy-only entry, and that only SFT reads the ``sft`` section, is derived from the
entry registry: ``control/entries.py``.)"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error, objective_family


@error("job.algorithm", "sft.train_path")
def sft_needs_train_path(cfg: PosttrainConfig) -> str | None:
    """SFT has no other data source than its demonstrations."""
    if objective_family(cfg) != "sft" or cfg.sft.train_path is not None:
        return None
    return (
        "sft.train_path is not set; point it at a JSONL file of chat rows (messages, or "
        "prompt/completion; docs/guides/sft.md)"
    )


@error("job.algorithm", "placement.policy_sharding")
def sft_unsharded_policy(cfg: PosttrainConfig) -> str | None:
    """The SFT entry places one replicated policy process; FSDP sharding is not wired for it."""
    if objective_family(cfg) != "sft" or cfg.placement.policy_sharding == "none":
        return None
    return (
        f"placement.policy_sharding={cfg.placement.policy_sharding}: the SFT entry trains one "
        "unsharded policy rank; set placement.policy_sharding=none"
    )


@error("sft.packing", "sft.loss_reduction")
def packing_needs_token_sum(cfg: PosttrainConfig) -> str | None:
    """A packed sequence holds several rows, so a per-sequence mean would weigh rows by how
    they were packed; the token sum does not depend on it."""
    if not cfg.sft.packing or cfg.sft.loss_reduction == "token_sum":
        return None
    return (
        f"sft.packing=true with sft.loss_reduction={cfg.sft.loss_reduction}: a packed "
        "sequence holds several rows; set sft.loss_reduction=token_sum or sft.packing=false"
    )


RULES = (sft_needs_train_path, sft_unsharded_policy, packing_needs_token_sum)
