"""Preflight of the entries, derived from the entry registry (``entrypoints/registry.py``):
which entry trains which ``job.algorithm``, which knobs a policy-only entry never reads, which
sections only one entry reads, how many policy ranks an entry places. No entry is named here.
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.config.build import OBJECTIVE_KNOBS
from posttrain.config.schema import PosttrainConfig, all_keys
from posttrain.control.rules import PreflightError, are, changed, error, objective_family
from posttrain.entrypoints.registry import ENTRIES, Entry, entry, section_owner

#: Settings of the online loop (prompts and how they are rendered, sampling, rewards, the
#: environment, the loop's schedule, the language model's options); with every online
#: objective's knobs (their declarations' universe) they are what a policy-only entry refuses,
#: less the ones it reads (``Entry.online_reads``).
_LOOP_KNOBS = {
    "data": ("task", "train_path", "val_path", "reasoning_gym_dataset", "reasoning_gym_options",
             "digits", "exact_digits", "operators", "train_size", "val_size", "prompts_per_step",
             "allow_repeats", "prompt_template", "system_prompt", "user_template",
             "prompt_truncation"),
    "rollout": ("n", "temperature", "top_p", "max_tokens", "engine", "dtype"),
    "env": ("name", "tools", "max_turns", "max_context"),
    "vllm": ("kv_cache_space_gib", "max_model_len", "enforce_eager", "enable_prefix_caching",
             "tensor_parallel_size", "gpu_memory_utilization", "lora_sync"),
    "reward": ("verifier", "format_weight", "functions", "functions_anneal_steps",
               "shared_prefix_mask", "mask_truncated"),
    "rl": ("objective_builder", "dynamic_sampling", "max_sampling_rounds",
           "mini_batch_per_replica", "micro_batch_tokens", "off_policy_lag"),
    "model": ("tokenizer_path", "certified_deterministic_forward", "gradient_checkpointing",
              "init_preset", "lora_rank", "lora_alpha", "lora_target_modules"),
    "logging": ("train_samples_per_step",),
}  # fmt: skip

_ORDER = {key: i for i, key in enumerate(all_keys())}
_ONLINE = (
    frozenset({f"{s}.{k}" for s, names in _LOOP_KNOBS.items() for k in names}) | OBJECTIVE_KNOBS
)


def refused_knobs(e: Entry) -> tuple[str, ...]:
    """The online knobs policy-only entry ``e`` never reads, in schema order (none for an
    online entry)."""
    if e.placement != "policy_only":
        return ()
    return tuple(sorted(_ONLINE - set(e.online_reads), key=_ORDER.__getitem__))


def check_entry(cfg: PosttrainConfig, name: str) -> None:
    """Refuse a config whose ``job.algorithm`` belongs to another entry (one line, names it).

    ``posttrain grpo`` with ``job.algorithm=opd`` would train GRPO while the run directory and
    config claim OPD. An entry that records its runs under one label (OPD's ``opd``) pins it,
    so it refuses another label of its family rather than rewrite it.
    """
    family, label, own = objective_family(cfg), cfg.job.algorithm, entry(name)
    if family != name:
        raise PreflightError([
            f"job.algorithm={label} is {entry(family).kind}, which `posttrain {name}` does not "
            f"train; run `posttrain {family} --config ...`"
        ])  # fmt: skip
    if own.pinned_label is not None and label != own.pinned_label:
        raise PreflightError([
            f"job.algorithm={label}: the {own.title} entry records its runs as "
            f"job.algorithm={own.pinned_label}; set that and tell runs apart by job.name"
        ])  # fmt: skip


def refuse_unread_overrides(opts: Sequence[str], cfg: PosttrainConfig) -> None:
    """An override of a knob the config's entry never reads, even one equal to its default
    (``rollout.n=8``, which preflight cannot tell from an unset key), claims a setting."""
    e = entry(objective_family(cfg))
    refused = set(refused_knobs(e))
    given = [o for o in opts if o.partition("=")[0].strip() in refused]
    if given:
        raise PreflightError([
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} never read by "
            f"job.algorithm={cfg.job.algorithm} ({e.refused_note}); remove "
            f"{'it' if len(given) == 1 else 'them'}"
        ])  # fmt: skip


_ALL_REFUSED = sorted({k for e in ENTRIES for k in refused_knobs(e)}, key=_ORDER.__getitem__)


@error(*_ALL_REFUSED)
def entry_reads_no_online_knobs(cfg: PosttrainConfig) -> str | None:
    """A policy-only entry (no rollout, no reward) trains on a fixed data set: the online
    loop's prompts, sampling, rewards and objective knobs, and the language-model options it
    does not declare, never enter its loss, so a changed value would claim a setting nothing
    reads."""
    e = entry(objective_family(cfg))
    knobs = [
        k
        for key in refused_knobs(e)
        for k in changed(getattr(cfg, key.split(".")[0]), key.split(".")[1])
    ]
    if not knobs:
        return None
    return (
        f"{are(knobs)} never read by job.algorithm={cfg.job.algorithm} ({e.refused_note}); "
        "reset to the defaults"
    )


_OWNED = [
    f"{s}.{k}"
    for e in ENTRIES
    for s in e.sections
    for k in PosttrainConfig.sections()[s].model_fields
]


@error("job.algorithm", *_OWNED)
def section_read_only_by_its_entry(cfg: PosttrainConfig) -> str | None:
    """A section only one entry reads (``dpo``, ``sft``) keeps its defaults under the others."""
    family = objective_family(cfg)
    parts = []
    for name in PosttrainConfig.sections():
        owner = section_owner(name)
        if owner is None or owner.name == family:
            continue
        section = getattr(cfg, name)
        knobs = changed(section, *type(section).model_fields)
        if knobs:
            parts.append(
                f"{are(knobs)} read only by {owner.title}, not by job.algorithm="
                f"{cfg.job.algorithm}; remove them or set job.algorithm={owner.name}"
            )
    return "; ".join(parts) or None


@error("job.algorithm", "placement.policy_ranks")
def entry_policy_ranks(cfg: PosttrainConfig) -> str | None:
    """An entry that places a bounded number of policy processes (DPO: one, local or one Ray
    actor) refuses more."""
    e = entry(objective_family(cfg))
    most = e.max_policy_ranks
    if most is None or cfg.placement.policy_ranks <= most:
        return None
    return (
        f"placement.policy_ranks={cfg.placement.policy_ranks}: the {e.title} entry trains "
        f"{'one policy rank' if most == 1 else f'at most {most} policy ranks'}; set "
        f"placement.policy_ranks={most}"
    )


@error("job.algorithm", "placement.policy_sharding")
def entry_policy_sharding(cfg: PosttrainConfig) -> str | None:
    """An entry whose trainer does not shard (Diffusion DPO) refuses FSDP rather than run
    replicated under a sharded label."""
    e = entry(objective_family(cfg))
    if e.shardable or cfg.placement.policy_sharding == "none":
        return None
    return (
        f"placement.policy_sharding={cfg.placement.policy_sharding}: the {e.title} entry trains "
        "an unsharded policy; set placement.policy_sharding=none"
    )


_STEP_KEYS = sorted({e.step_key for e in ENTRIES if e.step_key}, key=_ORDER.__getitem__)


@error("job.algorithm", "placement.policy_ranks", *_STEP_KEYS)
def entry_step_covers_ranks(cfg: PosttrainConfig) -> str | None:
    """A policy-only step shares its rows (or whole pairs) out among the policy ranks, so it
    needs one for each (a packed SFT step keeps a sequence per rank: ``data/sft.py``)."""
    e = entry(objective_family(cfg))
    ranks = cfg.placement.policy_ranks
    if e.step_key is None:
        return None
    section, key = e.step_key.split(".")
    per_step = getattr(getattr(cfg, section), key)
    if per_step >= ranks:
        return None
    return (
        f"{e.step_key}={per_step} gives some of placement.policy_ranks={ranks} no {e.unit}; "
        f"raise {e.step_key} to at least {ranks} or lower policy_ranks"
    )


RULES = (
    entry_reads_no_online_knobs,
    section_read_only_by_its_entry,
    entry_policy_ranks,
    entry_policy_sharding,
    entry_step_covers_ranks,
)
