"""Preflight for Diffusion DPO: its pairs, its loss's knobs, its schedule. (What every policy-only
entry refuses, and that only DPO reads the ``dpo`` section, is derived from the entry registry:
``control/entries.py``.)"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import are, changed, error, objective_family


@error("job.algorithm", "dpo.pairs_path")
def dpo_needs_pairs(cfg: PosttrainConfig) -> str | None:
    """DPO has no other data source than its pairs manifest."""
    if objective_family(cfg) != "dpo" or cfg.dpo.pairs_path is not None:
        return None
    return (
        "dpo.pairs_path is not set; point it at a pairs manifest (`posttrain dpo make-pairs` "
        "writes one)"
    )


@error("dpo.loss", "dpo.beta", "dpo.min_timestep")
def beta_without_dpo_loss(cfg: PosttrainConfig) -> str | None:
    """Fine-tuning on winners is a plain denoising loss; it has no β and no DPO weighting."""
    knobs = [] if cfg.dpo.loss == "dpo" else changed(cfg.dpo, "beta", "min_timestep")
    if not knobs:
        return None
    return f"{are(knobs)} never read by dpo.loss={cfg.dpo.loss}; remove them"


@error("dpo.min_timestep", "dpo.sample_steps", "model.name_or_path")
def dpo_timesteps_within_schedule(cfg: PosttrainConfig) -> str | None:
    """The timestep range and DDIM steps must fit the model's DDPM schedule (read from its
    pipeline folder, no weights) rather than fail after the model has loaded."""
    from posttrain.config.dpo import schedule_problem

    return (
        schedule_problem(cfg.dpo, cfg.model.name_or_path)
        if objective_family(cfg) == "dpo"
        else None
    )


RULES = (dpo_needs_pairs, beta_without_dpo_loss, dpo_timesteps_within_schedule)
