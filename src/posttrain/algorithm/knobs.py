"""What each built-in online objective reads: its knobs and its declaration of reads.

Torch-free, beside the objectives' math (``grpo.py``, ``opd.py``, ``annotators/advantage.py``
re-export these names), so preflight and ``posttrain config show`` check a config's knobs
without importing torch.
"""

from __future__ import annotations

from typing import Any

from posttrain.algorithm.primitives.reads import Reads

#: Estimators that fix their own scaling (``scaling`` is not read).
FIXED_SCALING = {"dr_grpo": "none", "reinforce_pp": "batch"}

#: Every knob an advantage can depend on, the shaped task reward it is computed from included.
ADVANTAGE_KNOBS = frozenset({
    "rl.advantage_estimator", "rl.reward_scaling", "rl.advantage_eps", "rl.credit",
    "reward.overlong_buffer", "reward.overlong_penalty",
})  # fmt: skip


def advantage_reads(config) -> Reads:
    """The knobs the advantage reads under ``config``: an objective that trains on
    ``batch.advantages`` reads these (its declaration includes this one)."""
    rl, reward = config.rl, config.reward
    est = rl.advantage_estimator
    keys = {"rl.advantage_estimator", "reward.overlong_buffer"}
    unread: dict[str, str] = {}
    env = getattr(config, "env", None)
    if env is not None and env.name:
        keys.add("rl.credit")
    else:  # a single-turn response is one turn: per-turn credit is the trajectory's
        unread["rl.credit"] = "one turn per response without env.name"
    if est in FIXED_SCALING:
        unread["rl.reward_scaling"] = f"rl.advantage_estimator={est} fixes its own scaling"
    else:
        keys.add("rl.reward_scaling")
    if FIXED_SCALING.get(est, rl.reward_scaling) == "none":
        unread["rl.advantage_eps"] = f"no std division with rl.advantage_estimator={est}"
    else:
        keys.add("rl.advantage_eps")
    if reward.overlong_buffer:
        keys.add("reward.overlong_penalty")
    else:
        unread["reward.overlong_penalty"] = "the overlong punishment is off at overlong_buffer=0"
    return Reads(frozenset(keys), f"rl.advantage_estimator={est}", unread)


#: The clipped surrogate's own knobs (beside the advantage's): what ``legacy_pg`` never reads.
CLIPPED_KNOBS = frozenset({
    "rl.importance_sampling_level", "rl.epsilon_low", "rl.epsilon_high", "rl.lower_bound_ratio",
    "rl.temperature", "rl.loss_type", "rl.kl_beta", "rl.kl_estimator", "rl.entropy_coef",
    "rl.rollout_is_cap", "rl.reference_reset_every", "rl.reset_optimizer",
})  # fmt: skip

#: Every knob a GRPO-family objective may read.
GRPO_KNOBS = frozenset({"rl.grpo_surrogate"}) | CLIPPED_KNOBS | ADVANTAGE_KNOBS

_LEGACY_UNREAD = {
    "rl.importance_sampling_level": "no importance ratio; select rl.grpo_surrogate=clipped",
    "rl.epsilon_low": "no ratio clip",
    "rl.epsilon_high": "no ratio clip",
    "rl.lower_bound_ratio": "no ratio clip",
    "rl.temperature": "it scores at temperature 1",
    "rl.loss_type": "always the token mean",
    "rl.kl_beta": "no KL term",
    "rl.kl_estimator": "no KL term",
    "rl.reference_reset_every": "no KL term, no reference to reset",
    "rl.reset_optimizer": "no KL term, no reference to reset",
    "rl.entropy_coef": "no entropy term",
    "rl.rollout_is_cap": "no importance correction",
}

#: What CISPO leaves out of the clipped surrogate's knobs.
_CISPO_UNREAD = {
    "rl.epsilon_low": "its importance weight has no lower bound",
    "rl.lower_bound_ratio": "no dual clip",
    "rl.importance_sampling_level": "it weights each token",
}


def grpo_reads(config: Any) -> Reads:
    """The knobs the GRPO objective ``rl.grpo_surrogate`` selects reads under ``config``."""
    rl = config.rl
    surrogate = rl.grpo_surrogate
    if surrogate == "legacy_pg":
        base = Reads(
            frozenset({"rl.grpo_surrogate"}), "rl.grpo_surrogate=legacy_pg", _LEGACY_UNREAD
        )
        return base | advantage_reads(config)
    keys = set(CLIPPED_KNOBS) | {"rl.grpo_surrogate"}
    unread: dict[str, str] = {}
    by = f"rl.grpo_surrogate={surrogate}"
    if surrogate == "cispo":
        keys -= set(_CISPO_UNREAD)
        unread.update(_CISPO_UNREAD)
    elif rl.importance_sampling_level == "sequence":
        by += ", rl.importance_sampling_level=sequence"
        keys.discard("rl.lower_bound_ratio")
        unread["rl.lower_bound_ratio"] = "the dual clip bounds a per-token ratio"
    if rl.kl_beta == 0:
        keys.discard("rl.kl_estimator")
        unread["rl.kl_estimator"] = "no KL anchor with rl.kl_beta=0"
        keys.discard("rl.reference_reset_every")
        unread["rl.reference_reset_every"] = "no KL reference to reset with rl.kl_beta=0"
    if rl.kl_beta == 0 or rl.reference_reset_every == 0:
        keys.discard("rl.reset_optimizer")
        unread["rl.reset_optimizer"] = (
            "read only at a reference reset (rl.reference_reset_every > 0)"
        )
    reads = Reads(frozenset(keys), by, unread) | advantage_reads(config)
    if surrogate == "clipped" and rl.importance_sampling_level == "sequence":
        # the sequence-level ratio is weighted by one advantage per response
        why = {"rl.credit": "the sequence-level ratio takes one advantage per response"}
        return Reads(reads.keys - {"rl.credit"}, by, {**reads.unread, **why})
    return reads


_CLIP = ("rl.epsilon_low", "rl.epsilon_high", "rl.lower_bound_ratio", "rl.rollout_is_cap")
_DIRECT = ("rl.divergence", "rl.jsd_beta", "teacher.top_k")

#: Every knob an OPD objective may read.
OPD_KNOBS = frozenset({"rl.distillation_mode", "rl.loss_type", "rl.temperature", *_CLIP, *_DIRECT})

#: Knobs of the GRPO family that no OPD mode reads, and why.
_UNREAD = {
    **dict.fromkeys(GRPO_KNOBS - OPD_KNOBS, "the teacher is the signal, on the clipped surrogate"),
    **dict.fromkeys(ADVANTAGE_KNOBS, "the teacher is the signal, not the task reward"),
    "rl.importance_sampling_level": "its signal is per token; use rl.importance_sampling_level=token",
    # OPD's anchor is the teacher, which a reset would never replace; it has no KL reference.
    "rl.reference_reset_every": "OPD has no KL reference to reset, its anchor is the teacher",
    "rl.reset_optimizer": "OPD has no KL reference to reset, its anchor is the teacher",
}


def opd_reads(config: Any) -> Reads:
    """The knobs the OPD objective ``rl.distillation_mode`` selects reads under ``config``."""
    rl = config.rl
    mode = rl.distillation_mode
    keys = {"rl.distillation_mode", "rl.loss_type", "rl.temperature"}
    unread = dict(_UNREAD)
    if mode == "advantage":
        keys.update(_CLIP)
        unread.update(dict.fromkeys(_DIRECT, "read only with rl.distillation_mode=direct"))
    else:
        keys.update(_DIRECT)
        unread.update(dict.fromkeys(_CLIP, "no ratio, no clip"))
        if rl.divergence != "jsd":
            keys.discard("rl.jsd_beta")
            unread["rl.jsd_beta"] = "read only by rl.divergence=jsd"
    # The direct mode's loss is exact at every position it is given: a lag only changes which.
    return Reads(frozenset(keys), f"OPD, rl.distillation_mode={mode}", unread, mode == "direct")


#: SFT reads no knob of the online objectives' universe.
SFT_KNOBS: frozenset[str] = frozenset()


def sft_reads(config: Any) -> Reads:
    """SFT's cross-entropy reads no objective knob (``sft.loss_reduction`` is its own section's)."""
    return Reads(frozenset(), "the objective builder posttrain.algorithm.sft:make_objective")


#: DPO for language models reads no knob of the online objectives' universe.
LMDPO_KNOBS: frozenset[str] = frozenset()


def lmdpo_reads(config: Any) -> Reads:
    """LM DPO's loss reads no objective knob (β, ε and the loss are its own section's)."""
    return Reads(frozenset(), "the objective builder posttrain.algorithm.lmdpo:make_objective")
