"""Preflight for on-policy distillation: the teacher role and OPD's warnings (which entry runs
which algorithm is the entry registry's: ``control/entries.py``).

Which ``rl`` knobs each OPD mode reads is the OPD objective's declaration
(``algorithm/opd.py:reads``); ``control/reads.py`` derives those rejections.
"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import are, changed, error, objective_family, warning


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
