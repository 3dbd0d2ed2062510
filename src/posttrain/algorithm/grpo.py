"""The GRPO-family objective: ``rl`` config section -> :class:`Objective`.

``rl.grpo_surrogate`` selects the surrogate: ``clipped`` (PPO-style ratio against a frozen π_old,
asymmetric and dual clipping, token or sequence (GSPO) ratio, optional KL anchor), ``cispo``
(MiniMax-M1: the clipped importance weight, detached, times ``-A * logp``; same KL anchor,
entropy bonus and reductions) or ``legacy_pg`` (plain ``-A * logp``, kept for toy and parity
runs). Dr-GRPO and GSPO are config
choices on ``clipped``; no other objective exists for them.

``legacy_pg`` is TOKEN_SUM with the ``token-mean`` reduction: its loss is the mean over all
response tokens of the optimizer step, exactly, however the step is split.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from posttrain.algorithm.knobs import GRPO_KNOBS as KNOBS  # noqa: F401 (re-exported)
from posttrain.algorithm.knobs import grpo_reads as reads
from posttrain.algorithm.primitives.divergence import kl_penalty
from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    ObjectiveContractError,
    OldLogpCache,
    Reduction,
    ReferenceScorer,
)
from posttrain.algorithm.primitives.policy_gradient import (
    cispo_policy_gradient_loss,
    clipped_policy_gradient_loss,
    legacy_policy_gradient_loss,
    masked_mean,
    response_bound,
    token_sum_loss,
)
from posttrain.algorithm.primitives.reads import declare_reads
from posttrain.algorithm.primitives.rollout_correction import correct_for_the_sampler
from posttrain.data.logprobs import response_logprobs_and_entropy
from posttrain.data.trajectory import TrajectoryBatch

#: Local metric name -> public suffix (published as train/<suffix> and val/<suffix>).
GRPO_METRICS = {
    "pg_loss": "pg/loss",
    "clip_frac_low": "pg/clip_frac_low",
    "clip_frac_high": "pg/clip_frac_high",
    "dual_clip_frac": "pg/dual_clip_frac",
    "ratio_mean": "pg/ratio_mean",
    "ratio_min": "pg/ratio_min",
    "ratio_max": "pg/ratio_max",
    "approx_kl": "pg/approx_kl_old",
    "seq_clip_frac": "pg/seq_clip_frac",
    "seq_log_ratio_abs_mean": "pg/seq_log_ratio_abs_mean",
    "kl_ref": "pg/kl_ref",
    "entropy_proxy": "pg/neg_logprob_mean",
    "entropy": "pg/entropy",
    "rollout_logprob_abs_diff": "rollout/logprob_abs_diff",
    "rollout_logprob_abs_diff_max": "rollout/logprob_abs_diff_max",
    "rollout_is_weight_mean": "rollout/is_weight_mean",
    "rollout_is_weight_max": "rollout/is_weight_max",
    "rollout_is_truncated_frac": "rollout/is_truncated_frac",
}


#: Metrics that are not token/sequence means (everything else is a weighted mean).
GRPO_REDUCTIONS = {
    "ratio_min": "min", "ratio_max": "max", "rollout_logprob_abs_diff_max": "max",
}  # fmt: skip
#: The GRPO surrogates' own (OPD shares GRPO_REDUCTIONS but reports no importance weight).
SURROGATE_REDUCTIONS = {**GRPO_REDUCTIONS, "rollout_is_weight_max": "max"}


def _require_advantages(batch: TrajectoryBatch) -> Tensor:
    if batch.advantages is None:
        raise ObjectiveContractError(
            "batch.advantages is missing: run the reward stage's advantage annotator before dispatch"
        )
    return batch.advantages


def identity_of(rl: Any) -> dict[str, Any]:
    """The values that define the algorithm; token-level runs omit the sequence-level key."""
    if rl.grpo_surrogate == "legacy_pg":
        return {"grpo_surrogate": "legacy_pg", "loss_type": "token-mean"}
    ident = {
        "grpo_surrogate": rl.grpo_surrogate,
        "loss_type": rl.loss_type,
        "epsilon_low": float(rl.epsilon_low),
        "epsilon_high": float(rl.epsilon_high),
        "lower_bound_ratio": float(rl.lower_bound_ratio),
        "temperature": float(rl.temperature),
        "kl_beta": float(rl.kl_beta),
    }
    if rl.grpo_surrogate == "cispo":
        del ident["epsilon_low"], ident["lower_bound_ratio"]
    if rl.kl_beta > 0:
        ident["kl_estimator"] = rl.kl_estimator
    if rl.entropy_coef:
        ident["entropy_coef"] = float(rl.entropy_coef)
    if rl.importance_sampling_level == "sequence":
        ident["importance_sampling_level"] = "sequence"
    if rl.rollout_is_cap > 0:
        ident["rollout_is_cap"] = float(rl.rollout_is_cap)
    return ident


def _finish(per_token: Tensor, mask: Tensor, loss_type: str, max_len: int | None, metrics: dict):
    loss, weight = token_sum_loss(per_token, mask, loss_type, max_response_length=max_len)
    metrics["pg_loss"] = loss.detach()
    metrics[OBJECTIVE_WEIGHT_SUM] = weight
    return loss, metrics


@declare_reads(reads)
def make_objective(rl: Any, context: Any) -> Objective:
    """Build the configured GRPO-family objective.

    ``rl`` needs ``grpo_surrogate``, ``importance_sampling_level``, ``epsilon_low``,
    ``epsilon_high``, ``lower_bound_ratio``, ``temperature``, ``loss_type``, ``kl_beta`` and
    ``kl_estimator`` and ``rollout_is_cap`` (0: off; else the policy-gradient term of each token
    is weighted by ``min(π_old / π_rollout, cap)``; the KL term is not), and optionally
    ``entropy_coef`` (the clipped surrogate's entropy bonus: ``- entropy_coef * H_t`` per token,
    reduced by ``loss_type`` like the policy loss). Every surrogate reports the true per-token
    entropy ``H_t`` of the policy at the loss temperature as ``pg/entropy``.
    ``context`` carries ``max_response_length`` (the rollout bound, for
    ``seq-mean-token-sum-fixed``) and, when ``kl_beta > 0``, ``reference_model``: the frozen
    network the placement also hands to the trainer as an auxiliary model. Each value is
    validated once, by the config section; :func:`reads` declares which ones a surrogate reads.
    """
    adapter = MetricAdapter(GRPO_METRICS, reductions=SURROGATE_REDUCTIONS)
    if rl.grpo_surrogate == "legacy_pg":

        def legacy(model: nn.Module, batch: TrajectoryBatch):
            adv = _require_advantages(batch)
            logp, entropy = response_logprobs_and_entropy(model, batch, 1.0, "metric")
            m = batch.response_mask
            per_token = legacy_policy_gradient_loss(logp, adv, m)
            metrics = {
                "entropy_proxy": masked_mean(-logp.detach(), m),
                "entropy": masked_mean(entropy, m),
            }
            return _finish(per_token, m, "token-mean", None, metrics)

        return Objective(legacy, Reduction.TOKEN_SUM, adapter, identity=identity_of(rl))

    max_len = response_bound(rl.loss_type, context)
    temperature = float(rl.temperature)
    kl_beta = float(rl.kl_beta)
    entropy_coef = float(rl.entropy_coef)
    scorer = None
    if kl_beta > 0:
        ref = getattr(context, "reference_model", None)
        if ref is None:
            raise ValueError("rl.kl_beta > 0 needs context.reference_model (the frozen reference)")
        scorer = ReferenceScorer(ref, temperature)
    cache = OldLogpCache(temperature)
    # Snapshot the knobs: the objective must not change if the config object is mutated later.
    level, loss_type, kl_estimator = rl.importance_sampling_level, rl.loss_type, rl.kl_estimator
    is_cap = float(rl.rollout_is_cap)
    eps_low, eps_high, lbr = (
        float(rl.epsilon_low),
        float(rl.epsilon_high),
        float(rl.lower_bound_ratio),
    )
    cispo = rl.grpo_surrogate == "cispo"

    def surrogate(logp: Tensor, old: Tensor, adv: Tensor, m: Tensor):
        if cispo:
            return cispo_policy_gradient_loss(logp, old, adv, m, epsilon_high=eps_high)
        return clipped_policy_gradient_loss(
            logp, old, adv, m, epsilon_low=eps_low, epsilon_high=eps_high,
            lower_bound_ratio=lbr, importance_sampling_level=level,
        )  # fmt: skip

    def clipped(model: nn.Module, batch: TrajectoryBatch):
        adv = _require_advantages(batch)
        logp, entropy = response_logprobs_and_entropy(
            model, batch, temperature, "grad" if entropy_coef else "metric"
        )
        m = batch.response_mask
        old = cache.old_logprobs(batch, logp)
        per_token, metrics = surrogate(logp, old, adv, m)
        per_token = correct_for_the_sampler(
            per_token, old, batch.rollout_logprobs, m, is_cap, metrics
        )
        if scorer is not None:
            kl = kl_penalty(logp, scorer(batch), m, kl_estimator)
            per_token = per_token + kl_beta * kl
            metrics["kl_ref"] = masked_mean(kl.detach(), m)
        if entropy_coef:
            per_token = per_token - entropy_coef * entropy
        metrics["entropy_proxy"] = masked_mean(-logp.detach(), m)
        metrics["entropy"] = masked_mean(entropy.detach(), m)
        return _finish(per_token, m, loss_type, max_len, metrics)

    return Objective(
        clipped,
        Reduction.TOKEN_SUM,
        adapter,
        old_logp_cache=cache,
        identity=identity_of(rl),
    )
