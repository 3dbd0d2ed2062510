"""Preflight for on-policy distillation: the teacher role, OPD's warnings, and which entry runs
which algorithm.

Which ``rl`` knobs each OPD mode reads is the OPD objective's declaration
(``algorithm/opd.py:reads``); ``control/reads.py`` derives those rejections.
"""

from __future__ import annotations

from typing import Literal

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import (
    PreflightError,
    are,
    changed,
    error,
    objective_family,
    warning,
)

Entry = Literal["grpo", "opd", "dpo"]

#: What each objective family is, for the message that sends a recipe to its own entry.
_FAMILY_NAMES = {
    "grpo": "a GRPO-family algorithm (online RL)",
    "opd": "on-policy distillation",
    "dpo": "Diffusion DPO (offline, on preference pairs)",
}


def check_entry(cfg: PosttrainConfig, entry: Entry) -> None:
    """Refuse a config whose ``job.algorithm`` belongs to another entry (one line, names it).

    ``posttrain grpo`` with ``job.algorithm=opd`` would train GRPO while the run directory and
    config claim OPD; the OPD entry likewise never runs a GRPO-family label, and a DPO recipe
    runs only under ``posttrain dpo`` (and it only under that). The OPD entry pins
    ``job.algorithm=opd``, so it also refuses another OPD label rather than rewrite it.
    """
    family, label = objective_family(cfg), cfg.job.algorithm
    if "dpo" in (entry, family) and family != entry:
        raise PreflightError([
            f"job.algorithm={label} is {_FAMILY_NAMES[family]}, which `posttrain {entry}` does "
            f"not train; run `posttrain {family} --config ...`"
        ])  # fmt: skip
    if entry == "grpo" and family == "opd":
        raise PreflightError([
            f"job.algorithm={label} is on-policy distillation, which `posttrain grpo` does not "
            "train; run `posttrain opd --config ...` (python -m posttrain.entrypoints.opd)"
        ])  # fmt: skip
    if entry == "opd" and family == "grpo":
        raise PreflightError([
            f"job.algorithm={label} is a GRPO-family algorithm; train it with `posttrain grpo`, "
            "or set job.algorithm=opd for distillation"
        ])  # fmt: skip
    if entry == "opd" and label != "opd":
        raise PreflightError([
            f"job.algorithm={label}: the OPD entry records its runs as job.algorithm=opd; set "
            "that and tell runs apart by job.name"
        ])  # fmt: skip


@error("job.algorithm", "teacher.name_or_path")
def opd_needs_teacher(cfg: PosttrainConfig) -> str | None:
    """OPD learns from a teacher; without teacher.name_or_path there is nothing to distil."""
    if objective_family(cfg) != "opd" or cfg.teacher.name_or_path:
        return None
    return (
        f"job.algorithm={cfg.job.algorithm} needs teacher.name_or_path (a local Hugging Face "
        "directory whose tokenizer is the student's)"
    )


@error("job.algorithm", "teacher.name_or_path", "teacher.dtype")
def teacher_needs_opd(cfg: PosttrainConfig) -> str | None:
    """Only OPD builds a teacher; elsewhere a teacher setting would claim a model never loaded
    (teacher.top_k is the direct mode's read: the objective's declaration covers it)."""
    if objective_family(cfg) == "opd":
        return None
    knobs = changed(cfg.teacher, "name_or_path", "dtype")
    if not knobs:
        return None
    return f"{are(knobs)} never read by job.algorithm={cfg.job.algorithm} (no teacher); remove them"


@warning("job.algorithm", "rl.distillation_mode")
def opd_direct_ignores_reward(cfg: PosttrainConfig) -> str | None:
    """Direct OPD minimises a divergence to the teacher: task reward and group advantage are
    computed (metrics, validation, prefix masking) but are not training signals."""
    if objective_family(cfg) != "opd" or cfg.rl.distillation_mode != "direct":
        return None
    return (
        "rl.distillation_mode=direct: task reward and group advantage are not training signals "
        "(they still drive metrics, validation and reward.shared_prefix_mask)"
    )


@warning("job.algorithm", "rl.dynamic_sampling")
def dynamic_sampling_drops_teacher_signal(cfg: PosttrainConfig) -> str | None:
    """OPD learns from the teacher's per-token signal, which a group of equal task rewards
    still carries; dynamic sampling filters on task rewards only."""
    if not cfg.rl.dynamic_sampling or objective_family(cfg) != "opd":
        return None
    return (
        f"rl.dynamic_sampling=true with job.algorithm={cfg.job.algorithm}: groups of equal task "
        "rewards are dropped although the teacher's signal on them is not zero"
    )


RULES = (
    opd_needs_teacher,
    teacher_needs_opd,
    opd_direct_ignores_reward,
    dynamic_sampling_drops_teacher_signal,
)
