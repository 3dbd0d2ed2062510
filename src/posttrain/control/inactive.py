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


@error("rl.grpo_surrogate", "rl.rollout_is_cap")
def rollout_is_cap_needs_clipped(cfg: PosttrainConfig) -> str | None:
    """The truncated importance-sampling correction reweights the clipped surrogate's terms;
    legacy_pg never reads it."""
    if cfg.rl.grpo_surrogate == "clipped" or cfg.rl.rollout_is_cap == 0.0:
        return None
    return (
        f"rl.rollout_is_cap={cfg.rl.rollout_is_cap} is never read by rl.grpo_surrogate="
        f"{cfg.rl.grpo_surrogate}; set rl.rollout_is_cap=0 or rl.grpo_surrogate=clipped"
    )


@error("rl.advantage_estimator", "rl.reward_scaling", "rl.advantage_eps")
def advantage_eps_unread(cfg: PosttrainConfig) -> str | None:
    """dr_grpo, and rloo with reward_scaling=none, never divide the advantage by a std, so
    advantage_eps is never read."""
    rl = cfg.rl
    unscaled = rl.advantage_estimator == "dr_grpo" or (
        rl.advantage_estimator == "rloo" and rl.reward_scaling == "none"
    )
    if not unscaled or rl.is_default("advantage_eps"):
        return None
    return (
        f"rl.advantage_eps={rl.advantage_eps} is never read with rl.advantage_estimator="
        f"{rl.advantage_estimator} (no std division); {reset_hint(rl, 'advantage_eps')}"
    )


@error("rl.advantage_estimator", "rl.reward_scaling")
def reward_scaling_fixed_by_estimator(cfg: PosttrainConfig) -> str | None:
    """dr_grpo (no scaling) and reinforce_pp (batch std) fix their own scaling; only grpo and
    rloo read rl.reward_scaling."""
    rl = cfg.rl
    if rl.advantage_estimator not in ("dr_grpo", "reinforce_pp") or rl.is_default("reward_scaling"):
        return None
    return (
        f"rl.reward_scaling={rl.reward_scaling} is never read by rl.advantage_estimator="
        f"{rl.advantage_estimator} (it fixes its own scaling); {reset_hint(rl, 'reward_scaling')}"
    )


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


@error("rl.grpo_surrogate", "rl.entropy_coef")
def entropy_coef_needs_clipped(cfg: PosttrainConfig) -> str | None:
    """The entropy bonus is a term of the clipped surrogate; legacy_pg has none."""
    if cfg.rl.grpo_surrogate == "clipped" or cfg.rl.entropy_coef == 0.0:
        return None
    return (
        f"rl.entropy_coef={cfg.rl.entropy_coef} is never read by rl.grpo_surrogate=legacy_pg "
        f"(no entropy term); {reset_hint(cfg.rl, 'entropy_coef')} or set "
        "rl.grpo_surrogate=clipped"
    )


@error("reward.overlong_buffer", "reward.overlong_penalty")
def overlong_penalty_needs_buffer(cfg: PosttrainConfig) -> str | None:
    """reward.overlong_penalty scales the soft overlong punishment, which is off while
    reward.overlong_buffer=0."""
    if cfg.reward.overlong_buffer or cfg.reward.is_default("overlong_penalty"):
        return None
    return (
        f"reward.overlong_penalty={cfg.reward.overlong_penalty} is never read with "
        f"reward.overlong_buffer=0; {reset_hint(cfg.reward, 'overlong_penalty')} or set "
        "reward.overlong_buffer"
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


@error("job.algorithm", "reward.overlong_buffer", "reward.overlong_penalty")
def opd_ignores_overlong_punishment(cfg: PosttrainConfig) -> str | None:
    """The overlong punishment shapes the task reward, which the OPD losses never read (the
    teacher is their signal)."""
    if objective_family(cfg) != "opd":
        return None
    knobs = changed(cfg.reward, "overlong_buffer", "overlong_penalty")
    if not knobs:
        return None
    hint = reset_hint(cfg.reward, "overlong_buffer", "overlong_penalty")
    return f"{are(knobs)} never read by job.algorithm={cfg.job.algorithm} (OPD); {hint}"


RULES = (
    legacy_pg_clip_knobs,
    kl_beta_without_kl_term,
    kl_estimator_without_kl_term,
    rollout_is_cap_needs_clipped,
    legacy_pg_sequence_level,
    sequence_level_dual_clip,
    sequence_level_per_token_advantages,
    advantage_eps_unread,
    distillation_mode_without_opd,
    reward_scaling_fixed_by_estimator,
    grpo_unscaled_is_dr_grpo,
    entropy_coef_needs_clipped,
    overlong_penalty_needs_buffer,
    sampling_rounds_need_dynamic_sampling,
    opd_ignores_overlong_punishment,
)
