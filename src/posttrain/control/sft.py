"""Preflight for supervised fine-tuning: its data file, packing's loss unit. (What it refuses as a
policy-only entry, that only SFT reads the ``sft`` section, and that a step needs a row for each
policy rank, is derived from the entry registry: ``control/entries.py``.)"""

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


RULES = (sft_needs_train_path, packing_needs_token_sum)
