"""The sampling contract: the loss must score samples under the distribution that drew them."""

from __future__ import annotations

from posttrain.config.rl import RLConfig
from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error, warning


@error("rl.grpo_surrogate", "rollout.temperature", "rl.temperature")
def clipped_temperature_match(cfg: PosttrainConfig) -> str | None:
    """The clipped surrogate is on-policy: its ratio and loss score the responses at
    rl.temperature, so that must be the temperature they were sampled at."""
    if cfg.rl.grpo_surrogate != "clipped" or cfg.rollout.temperature == cfg.rl.temperature:
        return None
    return (
        f"rl.grpo_surrogate=clipped needs rl.temperature == rollout.temperature, got "
        f"{cfg.rl.temperature} and {cfg.rollout.temperature}; set both to the same value"
    )


@error("rl.grpo_surrogate", "rollout.temperature")
def legacy_pg_rollout_temperature(cfg: PosttrainConfig) -> str | None:
    """legacy_pg scores responses at temperature 1, so they must be sampled at 1.0."""
    if cfg.rl.grpo_surrogate != "legacy_pg" or cfg.rollout.temperature == 1.0:
        return None
    return (
        f"rl.grpo_surrogate=legacy_pg scores at temperature 1, so rollout.temperature must be "
        f"1.0 (got {cfg.rollout.temperature}); use rl.grpo_surrogate=clipped to train at "
        "another temperature"
    )


@error("rl.grpo_surrogate", "rl.temperature")
def legacy_pg_rl_temperature(cfg: PosttrainConfig) -> str | None:
    """legacy_pg never reads rl.temperature; a changed value would claim a setting the loss
    ignores."""
    default = RLConfig.default_of("temperature")
    if cfg.rl.grpo_surrogate != "legacy_pg" or cfg.rl.temperature == default:
        return None
    return (
        f"rl.temperature={cfg.rl.temperature} is never read by rl.grpo_surrogate=legacy_pg "
        f"(it scores at temperature 1); leave rl.temperature at {default}"
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


RULES = (
    clipped_temperature_match,
    legacy_pg_rollout_temperature,
    legacy_pg_rl_temperature,
    top_p_truncates_sampling,
)
