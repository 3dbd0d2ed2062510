"""The gap between the sampler and the trainer, and truncated importance sampling across it.

A rollout engine with its own low-precision weights (``rollout.dtype``) samples from a slightly
different distribution π_rollout than the trainer's π_old. The surrogate's ratio stays exact
(π_old is the trainer's own forward); what remains is that the samples came from π_rollout.
Truncated importance sampling reweights each token's policy-gradient term by
``min(π_old / π_rollout, cap)``, a detached coefficient (the truncation bounds the variance).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algorithm.primitives._checks import as_bool_mask, check_shape


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
