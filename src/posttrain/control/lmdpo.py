"""Preflight for DPO on language models: its pairs file, the placement it runs on, and the
micro-batching that keeps each pair whole. (What it refuses as a policy-only entry, and that
only it reads the ``lmdpo`` section, is derived from the entry registry: ``control/entries.py``.)"""

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


@error("job.algorithm", "placement.policy_sharding")
def lmdpo_unsharded_policy(cfg: PosttrainConfig) -> str | None:
    """The entry places one replicated policy process; FSDP sharding is not wired for it."""
    if not _ours(cfg) or cfg.placement.policy_sharding == "none":
        return None
    return (
        f"placement.policy_sharding={cfg.placement.policy_sharding}: the LM DPO entry trains "
        "one unsharded policy rank; set placement.policy_sharding=none"
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


RULES = (lmdpo_needs_train_path, lmdpo_unsharded_policy, pairs_stay_whole)
