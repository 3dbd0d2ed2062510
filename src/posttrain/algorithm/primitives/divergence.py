"""Per-token KL estimators between the policy and a reference, from policy samples.

With ``d = ref_logprobs - logprobs`` on tokens sampled from the policy (Schulman's estimators of
KL(pi || ref)): k1 = ``-d`` (unbiased, can be negative), k2 = ``d**2 / 2`` (low variance, biased),
k3 = ``exp(d) - 1 - d`` (unbiased and non-negative; GRPO's default KL anchor).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algorithm.primitives._checks import as_bool_mask, check_finite, check_shape
from posttrain.algorithm.primitives.choices import KLEstimator


def kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: KLEstimator = "k3"
) -> Tensor:
    """``[B, T]`` per-token KL estimate, exactly zero where ``mask`` is zero."""
    check_finite("logprobs", logprobs)
    check_shape("ref_logprobs", ref_logprobs, logprobs.shape)
    check_finite("ref_logprobs", ref_logprobs)
    m = as_bool_mask(mask, logprobs.shape)
    d = torch.where(m, ref_logprobs - logprobs, 0)
    if estimator == "k1":
        out = -d
    elif estimator == "k2":
        out = 0.5 * d * d
    elif estimator == "k3":
        out = torch.expm1(d) - d
    else:
        raise ValueError(f"KL estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    return torch.where(m, out, 0)
