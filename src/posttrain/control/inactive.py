"""Rejected settings around the objective that no objective's declaration decides: a setting
with two names, and a loop knob read only in one mode.

Which objective knob is read is each objective's declaration (``control/reads.py`` derives those
rejections); what remains here are rules about other sections' knobs.
"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error, reset_hint


@error("rl.advantage_estimator", "rl.reward_scaling")
def grpo_unscaled_is_dr_grpo(cfg: PosttrainConfig) -> str | None:
    """grpo without a std division is Dr-GRPO's advantage; one setting has one name, so the
    config says dr_grpo."""
    if cfg.rl.advantage_estimator != "grpo" or cfg.rl.reward_scaling != "none":
        return None
    return (
        "rl.advantage_estimator=grpo with rl.reward_scaling=none is Dr-GRPO's advantage; write "
        "rl.advantage_estimator=dr_grpo and leave rl.reward_scaling at its default"
    )


@error("rl.dynamic_sampling", "rl.max_sampling_rounds")
def sampling_rounds_need_dynamic_sampling(cfg: PosttrainConfig) -> str | None:
    """Without dynamic sampling every step samples exactly one round."""
    if cfg.rl.dynamic_sampling or cfg.rl.is_default("max_sampling_rounds"):
        return None
    return (
        f"rl.max_sampling_rounds={cfg.rl.max_sampling_rounds} is never read with "
        f"rl.dynamic_sampling=false; {reset_hint(cfg.rl, 'max_sampling_rounds')} or set "
        "rl.dynamic_sampling=true"
    )


RULES = (grpo_unscaled_is_dr_grpo, sampling_rounds_need_dynamic_sampling)
