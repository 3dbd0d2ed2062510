"""The sampling contract: the loss must score samples under the distribution that drew them."""

from __future__ import annotations

from posttrain.config.rl import RLConfig
from posttrain.config.schema import PosttrainConfig
from posttrain.control.reads import reads_or_none
from posttrain.control.rules import error, warning


@error("rl.objective_builder", "rl.grpo_surrogate", "rollout.temperature", "rl.temperature")
def loss_temperature_matches_rollout(cfg: PosttrainConfig) -> str | None:
    """The loss scores responses at rl.temperature when its objective reads it (by the
    declaration), else at temperature 1; they must have been sampled at that temperature."""
    reads = reads_or_none(cfg)
    if reads is None:
        return None
    if reads.reads("rl.temperature"):
        if cfg.rollout.temperature == cfg.rl.temperature:
            return None
        return (
            f"{reads.by} scores at rl.temperature, so it needs rl.temperature == "
            f"rollout.temperature, got {cfg.rl.temperature} and {cfg.rollout.temperature}; set "
            "both to the same value"
        )
    at = RLConfig.default_of("temperature")
    if cfg.rollout.temperature == at:
        return None
    return (
        f"{reads.by} scores at temperature {at:g}, so rollout.temperature must be {at} (got "
        f"{cfg.rollout.temperature}); use an objective that reads rl.temperature (e.g. "
        "rl.grpo_surrogate=clipped) to train at another temperature"
    )


@warning("rollout.top_p")
def top_p_truncates_sampling(cfg: PosttrainConfig) -> str | None:
    """Nucleus sampling draws from a truncated distribution while the loss scores the full
    one, so even the first update is slightly off-policy."""
    if cfg.rollout.top_p == 1.0:
        return None
    return (
        f"rollout.top_p={cfg.rollout.top_p}: responses come from a truncated distribution that "
        "the loss does not score, so updates are slightly off-policy"
    )


RULES = (loss_temperature_matches_rollout, top_p_truncates_sampling)
