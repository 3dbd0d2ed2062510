"""Preflight for DPO on language models: its pairs file, enough pairs for the policy ranks, and
the micro-batching that keeps each pair whole. (What it refuses as a policy-only entry, and that
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


@error("job.algorithm", "lmdpo.pairs_per_step", "placement.policy_ranks")
def lmdpo_pairs_cover_ranks(cfg: PosttrainConfig) -> str | None:
    """Each policy rank trains on whole pairs of every step, so a step needs a pair for each."""
    ranks = cfg.placement.policy_ranks
    if not _ours(cfg) or cfg.lmdpo.pairs_per_step >= ranks:
        return None
    return (
        f"lmdpo.pairs_per_step={cfg.lmdpo.pairs_per_step} gives some of placement.policy_ranks="
        f"{ranks} no pair; raise lmdpo.pairs_per_step to at least {ranks} or lower policy_ranks"
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


RULES = (lmdpo_needs_train_path, lmdpo_pairs_cover_ranks, pairs_stay_whole)
