"""On-policy distillation (OPD): ``rl`` config section -> :class:`Objective`.

The student samples responses; a frozen teacher scores them (``TrajectoryBatch.teacher_logprobs``
and, for the direct mode, its top-k next-token distribution) before dispatch. Two modes, selected
by ``rl.distillation_mode``:

- ``advantage`` (default): the per-token advantage is the negative sampled reverse KL,
  ``A_t = log π_teacher(y_t) - log π_old(y_t)``, fed to the clipped surrogate and its loss-type
  reductions exactly as GRPO uses them (π_old through the objective's ``old_logp_cache``).
- ``direct``: the per-token loss is a divergence between the student's and the teacher's
  next-token distributions (``rl.divergence``: reverse KL, forward KL or JSD(β)) over the teacher's
  top-k plus a remainder bucket, with the gradient through the student's logits.

Neither mode reads the task reward or the group advantage: the teacher is the signal.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posttrain.algorithm.grpo import GRPO_METRICS, SURROGATE_REDUCTIONS
from posttrain.algorithm.knobs import OPD_KNOBS as KNOBS  # noqa: F401 (re-exported)
from posttrain.algorithm.knobs import opd_reads as reads
from posttrain.algorithm.primitives.divergence import topk_divergence
from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    ObjectiveContractError,
    OldLogpCache,
    Reduction,
)
from posttrain.algorithm.primitives.policy_gradient import (
    clipped_policy_gradient_loss,
    masked_mean,
    response_bound,
    token_sum_loss,
)
from posttrain.algorithm.primitives.reads import declare_reads
from posttrain.algorithm.primitives.rollout_correction import correct_for_the_sampler
from posttrain.data.logprobs import response_logits, response_logprobs, token_logprobs
from posttrain.data.trajectory import TrajectoryBatch

_SAMPLER_GAP = (
    "rollout_logprob_abs_diff", "rollout_logprob_abs_diff_max", "rollout_is_weight_mean",
    "rollout_is_weight_max", "rollout_is_truncated_frac",
)  # fmt: skip
_PG_DIAGNOSTICS = (
    "clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean", "ratio_min", "ratio_max",
    "approx_kl",
)  # fmt: skip

#: Local metric name -> public suffix (published as train/<suffix> and val/<suffix>).
OPD_METRICS = {
    "loss": "opd/loss",
    "reverse_kl": "opd/reverse_kl",
    "teacher_logprob_mean": "opd/teacher_logprob_mean",
    "student_logprob_mean": "opd/student_logprob_mean",
    "divergence": "opd/divergence",
    "advantage_mean": "opd/advantage_mean",
    **{name: GRPO_METRICS[name] for name in _PG_DIAGNOSTICS},
    **{name: GRPO_METRICS[name] for name in _SAMPLER_GAP},
}


def identity_of(rl: Any, teacher_top_k: int | None = None) -> dict[str, Any]:
    """What defines the run's OPD loss: the mode and the knobs that mode reads."""
    ident: dict[str, Any] = {
        "distillation_mode": rl.distillation_mode,
        "loss_type": rl.loss_type,
        "temperature": float(rl.temperature),
    }
    if rl.distillation_mode == "advantage":
        ident.update(
            epsilon_low=float(rl.epsilon_low),
            epsilon_high=float(rl.epsilon_high),
            lower_bound_ratio=float(rl.lower_bound_ratio),
        )
        if rl.rollout_is_cap > 0:
            ident["rollout_is_cap"] = float(rl.rollout_is_cap)
        return ident
    ident["divergence"] = rl.divergence
    if rl.divergence == "jsd":
        ident["jsd_beta"] = float(rl.jsd_beta)
    if teacher_top_k is not None:
        ident["teacher_top_k"] = int(teacher_top_k)
    return ident


def _teacher_logprobs(batch: TrajectoryBatch) -> Tensor:
    if batch.teacher_logprobs is None:
        raise ObjectiveContractError(
            "batch.teacher_logprobs is missing: OPD needs the teacher role to score the rollout "
            "before dispatch (run it through the OPD entry)"
        )
    return batch.teacher_logprobs


def _as_token_sum(per_token: Tensor, m: Tensor, loss_type: str, max_len, metrics: dict):
    loss, weight = token_sum_loss(per_token, m, loss_type, max_response_length=max_len)
    metrics["loss"] = loss.detach()
    metrics[OBJECTIVE_WEIGHT_SUM] = weight
    return loss, metrics


@declare_reads(reads)
def make_objective(rl: Any, context: Any) -> Objective:
    """Build the OPD objective selected by ``rl.distillation_mode``.

    ``rl`` needs ``distillation_mode``, ``loss_type``, ``temperature``; the advantage mode also
    ``epsilon_low``, ``epsilon_high``, ``lower_bound_ratio``; the direct mode ``divergence`` and
    ``jsd_beta``. ``context`` carries ``max_response_length`` (for ``seq-mean-token-sum-fixed``)
    and ``teacher_top_k`` (recorded in the direct mode's identity).
    """
    mode, loss_type = rl.distillation_mode, rl.loss_type
    max_len = response_bound(loss_type, context)
    temperature = float(rl.temperature)
    adapter = MetricAdapter(OPD_METRICS, reductions=SURROGATE_REDUCTIONS)
    identity = identity_of(rl, getattr(context, "teacher_top_k", None))
    if mode == "advantage":
        return _advantage_objective(rl, loss_type, max_len, temperature, adapter, identity)
    return _direct_objective(rl, loss_type, max_len, temperature, adapter, identity)


def _advantage_objective(rl, loss_type, max_len, temperature, adapter, identity) -> Objective:
    cache = OldLogpCache(temperature)
    eps_low, eps_high = float(rl.epsilon_low), float(rl.epsilon_high)
    lbr, is_cap = float(rl.lower_bound_ratio), float(rl.rollout_is_cap)

    def advantage(model: nn.Module, batch: TrajectoryBatch):
        teacher = _teacher_logprobs(batch)
        m = batch.response_mask
        logp = response_logprobs(model, batch, temperature)
        old = cache.old_logprobs(batch, logp)
        # The negative sampled reverse KL of the policy that drew the batch: a fixed signal.
        adv = torch.where(m, teacher.to(old.dtype) - old, 0).detach()
        per_token, metrics = clipped_policy_gradient_loss(
            logp, old, adv, m, epsilon_low=eps_low, epsilon_high=eps_high, lower_bound_ratio=lbr
        )
        # Samples from other weights (a lag, rollout.dtype): the same truncated weight as GRPO's.
        per_token = correct_for_the_sampler(
            per_token, old, batch.rollout_logprobs, m, is_cap, metrics
        )
        metrics.update(
            reverse_kl=masked_mean(-adv, m),
            advantage_mean=masked_mean(adv, m),
            teacher_logprob_mean=masked_mean(teacher.detach(), m),
            student_logprob_mean=masked_mean(old, m),
        )
        return _as_token_sum(per_token, m, loss_type, max_len, metrics)

    return Objective(
        advantage, Reduction.TOKEN_SUM, adapter, old_logp_cache=cache, identity=identity
    )


def _direct_objective(rl, loss_type, max_len, temperature, adapter, identity) -> Objective:
    kind, beta = rl.divergence, float(rl.jsd_beta)

    def direct(model: nn.Module, batch: TrajectoryBatch):
        teacher = _teacher_logprobs(batch)
        if batch.teacher_topk_ids is None:
            raise ObjectiveContractError(
                "batch.teacher_topk_ids is missing: the direct mode needs the teacher's top-k "
                "distribution (the teacher role adds it when rl.distillation_mode=direct)"
            )
        m = batch.response_mask
        logits = response_logits(model, batch)
        logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        scaled = logits / temperature if temperature != 1.0 else logits
        per_token = topk_divergence(
            scaled, batch.teacher_topk_ids, batch.teacher_topk_logprobs, m, kind, beta
        )
        with torch.no_grad():
            student = token_logprobs(scaled, batch.response_ids)
            metrics = {
                "divergence": masked_mean(per_token.detach(), m),
                "reverse_kl": masked_mean(student - teacher.to(student.dtype), m),
                "teacher_logprob_mean": masked_mean(teacher, m),
                "student_logprob_mean": masked_mean(student, m),
            }
        return _as_token_sum(per_token, m, loss_type, max_len, metrics)

    return Objective(direct, Reduction.TOKEN_SUM, adapter, identity=identity)
