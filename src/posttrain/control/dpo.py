"""Preflight for Diffusion DPO: the offline preference entry reads no online-RL knob, and the
online entries read no ``dpo`` knob."""

from __future__ import annotations

from posttrain.config.build import OBJECTIVE_KNOBS
from posttrain.config.schema import PosttrainConfig, all_keys
from posttrain.control.rules import are, changed, error, objective_family

#: Settings of the online loop (prompts, sampling, rewards, the loop's schedule) that DPO never
#: reads; with every online objective's knobs (their declarations' universe) they make
#: :data:`ONLINE_KNOBS`.
_LOOP_KNOBS = {
    "data": ("task", "train_path", "val_path", "reasoning_gym_dataset", "reasoning_gym_options",
             "digits", "operators", "train_size", "val_size", "prompts_per_step",
             "prompt_template"),
    "rollout": ("n", "temperature", "top_p", "max_tokens", "engine"),
    "reward": ("verifier", "format_weight", "functions", "shared_prefix_mask", "mask_truncated"),
    "rl": ("objective_builder", "dynamic_sampling", "max_sampling_rounds",
           "mini_batch_per_replica", "micro_batch_tokens", "off_policy_lag"),
    "model": ("tokenizer_path", "certified_deterministic_forward", "gradient_checkpointing",
              "init_preset", "lora_rank", "lora_alpha", "lora_target_modules"),
    "logging": ("train_samples_per_step",),
}  # fmt: skip


def _online_knobs() -> dict[str, tuple[str, ...]]:
    order = {key: i for i, key in enumerate(all_keys())}
    keys = {f"{s}.{k}" for s, names in _LOOP_KNOBS.items() for k in names} | OBJECTIVE_KNOBS
    out: dict[str, tuple[str, ...]] = {}
    for key in sorted(keys, key=order.__getitem__):
        section, name = key.split(".")
        out[section] = (*out.get(section, ()), name)
    return out


#: Section -> the online knobs DPO never reads, in schema order.
ONLINE_KNOBS = _online_knobs()


@error(*(f"{s}.{k}" for s, keys in ONLINE_KNOBS.items() for k in keys))
def dpo_reads_no_online_knobs(cfg: PosttrainConfig) -> str | None:
    """DPO trains offline on fixed pairs: no prompts, sampling, rewards, surrogate or language
    model options enter its loss, so a changed value would claim a setting nothing reads."""
    if objective_family(cfg) != "dpo":
        return None
    knobs = [k for s, keys in ONLINE_KNOBS.items() for k in changed(getattr(cfg, s), *keys)]
    if not knobs:
        return None
    return (
        f"{are(knobs)} never read by job.algorithm={cfg.job.algorithm} (Diffusion DPO trains "
        "offline on dpo.pairs_path); reset to the defaults"
    )


@error("job.algorithm", "dpo.loss", "dpo.beta", "dpo.min_timestep", "dpo.pairs_path", "dpo.pairs_per_step",
       "dpo.eval_samples_per_class", "dpo.sample_steps", "dpo.sample_eta", "dpo.target_color")  # fmt: skip
def dpo_knobs_without_dpo(cfg: PosttrainConfig) -> str | None:
    """The dpo section is read only by the DPO entry (job.algorithm starting with dpo)."""
    if objective_family(cfg) == "dpo":
        return None
    knobs = changed(cfg.dpo, *type(cfg.dpo).model_fields)
    if not knobs:
        return None
    return (
        f"{are(knobs)} read only by Diffusion DPO, not by job.algorithm={cfg.job.algorithm}; "
        "remove them or set job.algorithm=dpo"
    )


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


@error("job.algorithm", "placement.policy_ranks")
def dpo_single_policy_rank(cfg: PosttrainConfig) -> str | None:
    """The DPO entry places one policy process (local or one Ray actor)."""
    if objective_family(cfg) != "dpo" or cfg.placement.policy_ranks == 1:
        return None
    return (
        f"placement.policy_ranks={cfg.placement.policy_ranks}: the DPO entry trains one policy "
        "rank; set placement.policy_ranks=1"
    )


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


RULES = (
    dpo_reads_no_online_knobs,
    dpo_knobs_without_dpo,
    dpo_needs_pairs,
    beta_without_dpo_loss,
    dpo_single_policy_rank,
    dpo_timesteps_within_schedule,
)
