"""The gap between the sampler and the trainer, and truncated importance sampling across it.

A rollout engine with its own low-precision weights (``rollout.dtype``) samples from a slightly
different distribution π_rollout than the trainer's π_old. The surrogate's ratio stays exact
(π_old is the trainer's own forward); what remains is that the samples came from π_rollout.
Truncated importance sampling reweights each token's policy-gradient term by
``min(π_old / π_rollout, cap)``, a detached coefficient (the truncation bounds the variance).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.algorithm.primitives._checks import (
    ObjectiveContractError,
    as_bool_mask,
    check_shape,
)
from posttrain.algorithm.primitives.policy_gradient import masked_mean


def truncated_is_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """``[B, T]`` weights ``min(exp(old - rollout), cap)`` on masked tokens, 0 elsewhere.

    Detached: the weight corrects which samples were drawn, it is not optimised.
    """
    if not cap > 0:
        raise ValueError(f"the importance-sampling cap must be > 0, got {cap}")
    check_shape("rollout_logprobs", rollout_logprobs, tuple(old_logprobs.shape))
    m = as_bool_mask(mask, tuple(old_logprobs.shape))
    log_ratio = torch.where(m, old_logprobs.detach() - rollout_logprobs.detach(), 0.0)
    return torch.where(m, torch.exp(log_ratio).clamp(max=cap), 0.0)


def logprob_abs_diff(logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Mean ``|logprobs - rollout_logprobs|`` over masked tokens (0 for an empty mask)."""
    m = as_bool_mask(mask, tuple(logprobs.shape))
    diff = torch.where(m, (logprobs.detach() - rollout_logprobs.detach()).abs(), 0.0)
    return diff.sum() / m.sum().clamp(min=1)


def logprob_abs_diff_max(logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Largest ``|logprobs - rollout_logprobs|`` over masked tokens (0 for an empty mask): the
    worst token, which a mean over thousands hides."""
    m = as_bool_mask(mask, tuple(logprobs.shape))
    return torch.where(m, (logprobs.detach() - rollout_logprobs.detach()).abs(), 0.0).max()


def correct_for_the_sampler(
    per_token: Tensor,
    old_logprobs: Tensor,
    rollout_logprobs: Tensor | None,
    mask: Tensor,
    cap: float,
    metrics: dict[str, Tensor],
) -> Tensor:
    """``per_token`` weighted by :func:`truncated_is_weights` when ``cap > 0`` (unchanged when
    0), with the gap and weight metrics (``rollout_logprob_abs_diff`` and its ``_max``,
    ``rollout_is_weight_mean``,
    ``_max``, ``rollout_is_truncated_frac``) added to ``metrics``. One rule for every loss whose
    samples may come from other weights (``rollout.dtype``, ``rl.off_policy_lag``)."""
    if rollout_logprobs is None:
        if cap > 0:
            raise ObjectiveContractError(
                "rl.rollout_is_cap > 0 needs batch.rollout_logprobs (the sampler's logprobs)"
            )
        return per_token
    metrics["rollout_logprob_abs_diff"] = logprob_abs_diff(old_logprobs, rollout_logprobs, mask)
    metrics["rollout_logprob_abs_diff_max"] = logprob_abs_diff_max(
        old_logprobs, rollout_logprobs, mask
    )
    if not cap > 0:
        return per_token
    w = truncated_is_weights(old_logprobs, rollout_logprobs, mask, cap)
    cut = (old_logprobs.detach() - rollout_logprobs) > math.log(cap)
    metrics["rollout_is_weight_mean"] = masked_mean(w, mask)
    metrics["rollout_is_weight_max"] = w.max()
    metrics["rollout_is_truncated_frac"] = masked_mean(cut.to(w.dtype), mask)
    return per_token * w
