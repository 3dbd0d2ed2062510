"""Preflight for ``rl.off_policy_lag``: where a lagged rollout can run, its correction, and
where the reference scores (``placement.reference_on``)."""

from __future__ import annotations

from posttrain.config.build import needs_reference
from posttrain.config.schema import PosttrainConfig
from posttrain.control.reads import reads_or_none
from posttrain.control.rules import error, reset_hint, warning


@error("rl.off_policy_lag", "placement.backend")
def lag_needs_ray(cfg: PosttrainConfig) -> str | None:
    """A lagged rollout samples while the policy trains, with its own copy of the weights: on
    Ray the rollout actor has one; in-process the rollout shares the policy's module."""
    k = cfg.rl.off_policy_lag
    if not k or cfg.placement.backend == "ray":
        return None
    return (
        f"rl.off_policy_lag={k} needs placement.backend=ray (the rollout samples the next "
        "batches with its own weight copy while the policy trains); set placement.backend=ray "
        "or rl.off_policy_lag=0"
    )


@warning("rl.off_policy_lag", "rl.rollout_is_cap")
def lag_without_is_correction(cfg: PosttrainConfig) -> str | None:
    """With a lag every sample comes from weights k steps older than the trainer's: without the
    truncated importance weight the update is biased towards the stale sampler."""
    k = cfg.rl.off_policy_lag
    reads = reads_or_none(cfg)
    if not k or cfg.rl.rollout_is_cap > 0 or reads is None or not reads.reads("rl.rollout_is_cap"):
        return None
    return (
        f"rl.rollout_is_cap=0 with rl.off_policy_lag={k}: samples come from weights {k} step(s) "
        "older than the trainer's and nothing corrects for it; leave rl.rollout_is_cap unset "
        "(2.0 under a lag) or set it > 0"
    )


@warning("rl.off_policy_lag", "job.algorithm", "rl.grpo_surrogate")
def lag_with_an_uncorrected_loss(cfg: PosttrainConfig) -> str | None:
    """A loss that reads no ``rl.rollout_is_cap`` (``legacy_pg``) trains lagged samples
    uncorrected. A sampler-free loss (OPD's ``direct`` mode: a divergence over the whole
    next-token distribution) needs no correction; docs/guides/async.md measures it under a lag."""
    k = cfg.rl.off_policy_lag
    reads = reads_or_none(cfg)
    if not k or reads is None or reads.reads("rl.rollout_is_cap") or reads.sampler_free:
        return None
    return (
        f"rl.off_policy_lag={k} with a loss that applies no behaviour-policy correction (it "
        "reads no rl.rollout_is_cap): samples from older weights train uncorrected (see "
        "docs/guides/async.md); with GRPO set rl.grpo_surrogate=clipped or cispo, otherwise "
        "rl.off_policy_lag=0"
    )


@error("placement.reference_on", "rl.kl_beta")
def reference_on_without_a_reference(cfg: PosttrainConfig) -> str | None:
    """Where the reference scores means nothing when the run builds none."""
    pc = cfg.placement
    if pc.is_default("reference_on") or needs_reference(cfg):
        return None
    return (
        f"placement.reference_on={pc.reference_on} is never read: the run has no frozen "
        "reference (rl.kl_beta=0, or its objective reads no rl.kl_beta); "
        f"{reset_hint(pc, 'reference_on')} or set rl.kl_beta > 0"
    )


RULES = (
    lag_needs_ray,
    lag_without_is_correction,
    lag_with_an_uncorrected_loss,
    reference_on_without_a_reference,
)
