"""Preflight for ``rl.reference_reset_every`` where the reference lives (the knob itself is read
only with a KL reference: ``control/reads.py`` refuses it otherwise, from the objectives' reads)."""

from __future__ import annotations

from posttrain.config.build import needs_reference
from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error


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


RULES = (reset_with_a_data_side_reference,)
