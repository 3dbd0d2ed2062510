"""Preflight for on-policy distillation: the teacher section, the OPD knobs, and which entry runs
which algorithm.

OPD's training signal is the teacher. Its advantage mode reads the clipped surrogate's knobs
(epsilons, dual clip, temperature, loss_type) but no group-advantage or KL-anchor knob; its direct
mode reads no clip knob either. A resolved config that sets a knob its loss never reads is refused.
"""

from __future__ import annotations

from typing import Literal

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import PreflightError, are, changed, error, objective_family

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


def _direct(cfg: PosttrainConfig) -> bool:
    return objective_family(cfg) == "opd" and cfg.rl.distillation_mode == "direct"


@error("job.algorithm", "teacher.name_or_path")
def opd_needs_teacher(cfg: PosttrainConfig) -> str | None:
    """OPD learns from a teacher; without teacher.name_or_path there is nothing to distil."""
    if objective_family(cfg) != "opd" or cfg.teacher.name_or_path:
        return None
    return (
        f"job.algorithm={cfg.job.algorithm} needs teacher.name_or_path (a local Hugging Face "
        "directory whose tokenizer is the student's)"
    )


@error("job.algorithm", "teacher.name_or_path", "teacher.dtype", "teacher.top_k")
def teacher_needs_opd(cfg: PosttrainConfig) -> str | None:
    """Only OPD builds a teacher; elsewhere a teacher setting would claim a model never loaded."""
    if objective_family(cfg) == "opd":
        return None
    knobs = changed(cfg.teacher, "name_or_path", "dtype", "top_k")
    if not knobs:
        return None
    return f"{are(knobs)} never read by job.algorithm={cfg.job.algorithm} (no teacher); remove them"


@error("job.algorithm", "rl.grpo_surrogate", "rl.kl_beta", "rl.advantage_estimator",
       "rl.reward_scaling", "rl.advantage_eps", "rl.entropy_coef")  # fmt: skip
def opd_ignores_group_advantage_knobs(cfg: PosttrainConfig) -> str | None:
    """OPD's advantage is the teacher-student log-ratio, on the clipped surrogate, with the teacher
    as the anchor: the surrogate choice, the KL anchor, the group-advantage knobs and the
    entropy bonus are unread."""
    if objective_family(cfg) != "opd":
        return None
    knobs = changed(
        cfg.rl, "grpo_surrogate", "kl_beta", "advantage_estimator", "reward_scaling",
        "advantage_eps", "entropy_coef",
    )  # fmt: skip
    if not knobs:
        return None
    return (
        f"{are(knobs)} never read by OPD (job.algorithm={cfg.job.algorithm}: the teacher is the "
        "signal, on the clipped surrogate); reset them to their defaults"
    )


@error("job.algorithm", "rl.distillation_mode", "rl.epsilon_low", "rl.epsilon_high",
       "rl.lower_bound_ratio")  # fmt: skip
def opd_direct_clip_knobs(cfg: PosttrainConfig) -> str | None:
    """Direct OPD minimises a divergence with no importance ratio, so it reads no clip knob."""
    if not _direct(cfg):
        return None
    knobs = changed(cfg.rl, "epsilon_low", "epsilon_high", "lower_bound_ratio")
    if not knobs:
        return None
    return (
        f"{are(knobs)} never read by rl.distillation_mode=direct (no ratio, no clip); reset "
        "them or use rl.distillation_mode=advantage"
    )


@error("job.algorithm", "rl.distillation_mode", "rl.divergence", "rl.jsd_beta", "teacher.top_k")
def divergence_knobs_need_direct(cfg: PosttrainConfig) -> str | None:
    """rl.divergence, rl.jsd_beta and teacher.top_k shape only the direct mode's divergence."""
    if _direct(cfg):
        return None
    knobs = changed(cfg.rl, "divergence", "jsd_beta")
    if objective_family(cfg) == "opd":
        knobs += changed(cfg.teacher, "top_k")
    if not knobs:
        return None
    return f"{are(knobs)} read only by OPD with rl.distillation_mode=direct; remove them"


@error("rl.divergence", "rl.jsd_beta")
def jsd_beta_needs_jsd(cfg: PosttrainConfig) -> str | None:
    """rl.jsd_beta weights the generalised JSD; the KL divergences have no beta."""
    if cfg.rl.divergence == "jsd" or cfg.rl.is_default("jsd_beta"):
        return None
    return f"rl.jsd_beta={cfg.rl.jsd_beta} is read only by rl.divergence=jsd; remove it"


RULES = (
    opd_needs_teacher,
    teacher_needs_opd,
    opd_ignores_group_advantage_knobs,
    opd_direct_clip_knobs,
    divergence_knobs_need_direct,
    jsd_beta_needs_jsd,
)
