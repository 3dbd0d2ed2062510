"""Rejected settings: knobs the selected objective never reads.

A resolved config is provenance; it must not claim an algorithm setting the loss ignores.
"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import are, changed, error, objective_family, reset_hint

#: The clipped surrogate's knobs that legacy_pg never reads.
CLIP_KNOBS = ("epsilon_low", "epsilon_high", "lower_bound_ratio", "loss_type")


@error(
    "rl.grpo_surrogate",
    "rl.epsilon_low",
    "rl.epsilon_high",
    "rl.lower_bound_ratio",
    "rl.loss_type",
)
def legacy_pg_clip_knobs(cfg: PosttrainConfig) -> str | None:
    """legacy_pg has no importance ratio and always takes the token mean, so it reads no
    epsilon, dual clip or loss_type."""
    if cfg.rl.grpo_surrogate != "legacy_pg":
        return None
    knobs = changed(cfg.rl, *CLIP_KNOBS)
    if not knobs:
        return None
    return (
        f"{are(knobs)} never read by rl.grpo_surrogate=legacy_pg (no ratio clip, "
        f"token-mean loss); {reset_hint(cfg.rl, *CLIP_KNOBS)}, or select rl.grpo_surrogate=clipped"
    )


@error("rl.grpo_surrogate", "rl.kl_beta")
def kl_beta_without_kl_term(cfg: PosttrainConfig) -> str | None:
    """Only the clipped surrogate has a KL term; elsewhere kl_beta would be silently unused."""
    if cfg.rl.grpo_surrogate == "clipped" or cfg.rl.kl_beta == 0.0:
        return None
    return (
        f"rl.kl_beta={cfg.rl.kl_beta} is never read by rl.grpo_surrogate="
        f"{cfg.rl.grpo_surrogate} (no KL term); set rl.kl_beta=0 or rl.grpo_surrogate=clipped"
    )


@error("rl.kl_beta", "rl.kl_estimator")
def kl_estimator_without_kl_term(cfg: PosttrainConfig) -> str | None:
    """The estimator shapes the KL anchor only; with kl_beta=0 there is no anchor to shape."""
    if cfg.rl.kl_beta > 0 or cfg.rl.is_default("kl_estimator"):
        return None
    return (
        f"rl.kl_estimator={cfg.rl.kl_estimator} is never read with rl.kl_beta=0 (no KL anchor); "
        f"{reset_hint(cfg.rl, 'kl_estimator')}, or set rl.kl_beta > 0"
    )


@error("rl.grpo_surrogate", "rl.importance_sampling_level")
def legacy_pg_sequence_level(cfg: PosttrainConfig) -> str | None:
    """The importance-ratio level is a sub-knob of the clipped surrogate; legacy_pg has no
    ratio."""
    if cfg.rl.grpo_surrogate != "legacy_pg" or cfg.rl.importance_sampling_level == "token":
        return None
    return (
        "rl.importance_sampling_level=sequence is never read by rl.grpo_surrogate=legacy_pg "
        "(no importance ratio); select rl.grpo_surrogate=clipped for GSPO"
    )


@error("rl.importance_sampling_level", "rl.lower_bound_ratio")
def sequence_level_dual_clip(cfg: PosttrainConfig) -> str | None:
    """The dual clip bounds a per-token ratio; the sequence-level objective does not apply it."""
    if cfg.rl.importance_sampling_level != "sequence" or cfg.rl.lower_bound_ratio == 0.0:
        return None
    return (
        f"rl.lower_bound_ratio={cfg.rl.lower_bound_ratio} (dual clip) is not applied at "
        "rl.importance_sampling_level=sequence; set rl.lower_bound_ratio=0"
    )


@error("job.algorithm", "rl.importance_sampling_level", "rl.distillation_mode")
def sequence_level_per_token_advantages(cfg: PosttrainConfig) -> str | None:
    """A sequence ratio assumes one advantage per response. OPD's signal is per token, so OPD
    refuses the sequence level (the objective also refuses per-token advantages at run time)."""
    if objective_family(cfg) != "opd" or cfg.rl.importance_sampling_level != "sequence":
        return None
    return (
        f"rl.importance_sampling_level=sequence is not supported by job.algorithm="
        f"{cfg.job.algorithm} (OPD, rl.distillation_mode={cfg.rl.distillation_mode}): its "
        "signal is per token; use rl.importance_sampling_level=token"
    )


@error("rl.unbiased_advantage", "rl.advantage_eps")
def advantage_eps_unread(cfg: PosttrainConfig) -> str | None:
    """With unbiased_advantage the advantage is not divided by the group std, so advantage_eps
    is never read."""
    if not cfg.rl.unbiased_advantage or cfg.rl.is_default("advantage_eps"):
        return None
    return (
        f"rl.advantage_eps={cfg.rl.advantage_eps} is never read with rl.unbiased_advantage=true "
        f"(no std division); {reset_hint(cfg.rl, 'advantage_eps')}"
    )


@error("job.algorithm", "rl.distillation_mode")
def distillation_mode_without_opd(cfg: PosttrainConfig) -> str | None:
    """distillation_mode selects the OPD loss; GRPO-family algorithms never read it."""
    if objective_family(cfg) == "opd" or cfg.rl.is_default("distillation_mode"):
        return None
    return (
        f"rl.distillation_mode={cfg.rl.distillation_mode} is read only by OPD, not by "
        f"job.algorithm={cfg.job.algorithm}; {reset_hint(cfg.rl, 'distillation_mode')}"
    )


RULES = (
    legacy_pg_clip_knobs,
    kl_beta_without_kl_term,
    kl_estimator_without_kl_term,
    legacy_pg_sequence_level,
    sequence_level_dual_clip,
    sequence_level_per_token_advantages,
    advantage_eps_unread,
    distillation_mode_without_opd,
)
