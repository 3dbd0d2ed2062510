"""Policy-gradient surrogates and their reductions: the GRPO family's loss math.

Shapes: ``logprobs``, ``old_logprobs`` and ``mask`` are ``[B, T]``; ``advantages`` are ``[B]``
(one per response) or ``[B, T]``. Per-token outputs are ``[B, T]`` and exactly zero where the
mask is zero. Masked-out positions are neutralised with ``torch.where`` before any ``exp`` so
that padding can never leak NaN into gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algorithm.primitives._checks import as_bool_mask, check_finite, check_shape
from posttrain.algorithm.primitives.choices import LOSS_TYPES

#: Upper clamp on the sequence-level log-ratio (GSPO): exp(10) ~ 2.2e4.
SEQUENCE_LOG_RATIO_CAP = 10.0


def _prepare(logprobs: Tensor, mask: Tensor, old_logprobs: Tensor | None = None) -> Tensor:
    check_finite("logprobs", logprobs)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    if old_logprobs is not None:
        check_shape("old_logprobs", old_logprobs, logprobs.shape)
        check_finite("old_logprobs", old_logprobs)
    return as_bool_mask(mask, logprobs.shape)


def _token_advantages(advantages: Tensor, shape: torch.Size) -> Tensor:
    check_finite("advantages", advantages)
    if tuple(advantages.shape) == (shape[0],):
        return advantages.unsqueeze(-1)
    if tuple(advantages.shape) == tuple(shape):
        return advantages
    raise ValueError(
        f"advantages has shape {tuple(advantages.shape)}, expected [B]={shape[0]} or [B, T]={tuple(shape)}"
    )


def masked_mean(x: Tensor, m: Tensor) -> Tensor:
    """Mean of ``x`` over positions where ``m`` is true (0 for an empty mask)."""
    return torch.where(m, x, 0).sum() / m.sum().clamp(min=1)


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token log-ratio: ``sg[z_i] + (logp - sg[logp])`` on masked tokens, 0 elsewhere.

    ``z_i = sum_t m*(logp - old) / L_i`` is the length-normalised sequence log-ratio. Every token
    of response ``i`` carries the value ``z_i`` while its gradient flows only to its own logprob,
    which for one scalar advantage per response reproduces the sequence-level objective exactly.
    """
    m = _prepare(logprobs, mask, old_logprobs)
    diff = torch.where(m, logprobs - old_logprobs, 0)
    lengths = m.sum(-1).clamp(min=1).to(logprobs.dtype)
    z = diff.sum(-1) / lengths
    out = z.detach().unsqueeze(-1) + (logprobs - logprobs.detach())
    return torch.where(m, out, 0)


def clipped_policy_gradient_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    lower_bound_ratio: float = 0.0,
    importance_sampling_level: str = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-style clipped surrogate per token, with optional dual clip and GSPO sequence ratio.

    ``l = max(-A*r, -A*clip(r, 1-epsilon_low, 1+epsilon_high))``; with ``lower_bound_ratio > 1``,
    where ``A < 0`` also ``l = min(l, -A*lower_bound_ratio)`` (dual clip). ``lower_bound_ratio == 0``
    disables it. At ``importance_sampling_level="sequence"`` the ratio is
    ``exp(min(sequence_log_ratio, 10))``; dual clip and per-token advantages are refused there.
    Returns the ``[B, T]`` per-token loss and detached diagnostics.
    """
    m = _prepare(logprobs, mask, old_logprobs)
    adv = _token_advantages(advantages, logprobs.shape).to(logprobs.dtype)
    for name, eps in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
        if isinstance(eps, bool) or not eps >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {eps!r}")
    if epsilon_low >= 1:
        raise ValueError(
            f"epsilon_low must be < 1 (ratio floor 1-epsilon_low > 0), got {epsilon_low}"
        )
    if lower_bound_ratio != 0 and not lower_bound_ratio > 1:
        raise ValueError(
            f"lower_bound_ratio must be 0 (off) or > 1 (dual clip), got {lower_bound_ratio}"
        )
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}"
        )

    token_log_ratio = torch.where(m, logprobs - old_logprobs, 0)
    metrics: dict[str, Tensor] = {}
    if importance_sampling_level == "sequence":
        if lower_bound_ratio != 0:
            raise ValueError(
                "lower_bound_ratio (dual clip) is not defined at importance_sampling_level='sequence'"
            )
        if advantages.dim() != 1:
            raise ValueError(
                "importance_sampling_level='sequence' needs one advantage per response ([B]), "
                "got per-token advantages"
            )
        log_ratio = torch.clamp(
            sequence_log_ratio(logprobs, old_logprobs, m), max=SEQUENCE_LOG_RATIO_CAP
        )
    else:
        log_ratio = token_log_ratio
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    loss = torch.maximum(unclipped, clipped)
    if lower_bound_ratio > 1:
        dual = -adv * lower_bound_ratio
        dual_active = (adv < 0) & (dual < loss)
        loss = torch.where(adv < 0, torch.minimum(loss, dual), loss)
        metrics["dual_clip_frac"] = masked_mean(dual_active.to(loss.dtype), m).detach()
    loss = torch.where(m, loss, 0)

    with torch.no_grad():
        r = ratio.detach()
        low = (r < 1 - epsilon_low) & (adv < 0)
        high = (r > 1 + epsilon_high) & (adv > 0)
        metrics["clip_frac_low"] = masked_mean(low.to(r.dtype), m)
        metrics["clip_frac_high"] = masked_mean(high.to(r.dtype), m)
        any_tok = bool(m.any())
        metrics["ratio_mean"] = masked_mean(r, m)
        metrics["ratio_min"] = r[m].min() if any_tok else r.new_ones(())
        metrics["ratio_max"] = r[m].max() if any_tok else r.new_ones(())
        # k3 estimate of KL(pi_old || pi) from samples of pi_old: (r - 1) - log r per token.
        tr = token_log_ratio.detach()
        metrics["approx_kl"] = masked_mean(torch.expm1(tr) - tr, m)
        if importance_sampling_level == "sequence":
            has = m.any(-1)
            seq_clipped = (low | high).any(-1) & has
            metrics["seq_clip_frac"] = seq_clipped.sum().to(r.dtype) / has.sum().clamp(min=1)
            z = (tr.sum(-1) / m.sum(-1).clamp(min=1)).abs()
            metrics["seq_log_ratio_abs_mean"] = torch.where(has, z, 0).sum() / has.sum().clamp(
                min=1
            )
    return loss, metrics


def cispo_policy_gradient_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585) per token: ``l = -sg(min(r, 1+epsilon_high)) * A *
    logp``, ``r = exp(logp - old)``.

    The importance weight is clipped and detached, so every token keeps a gradient
    ``-w * A * grad logp`` (PPO's clip instead zeroes the gradient of clipped tokens). The paper
    sets no lower bound on the weight (its epsilon_low is taken large), so none is applied.
    Returns the ``[B, T]`` per-token loss and detached diagnostics named like the clipped
    surrogate's (``clip_frac_high``: tokens whose weight was capped; ``clip_frac_low`` is 0).
    """
    m = _prepare(logprobs, mask, old_logprobs)
    adv = _token_advantages(advantages, logprobs.shape).to(logprobs.dtype)
    if isinstance(epsilon_high, bool) or not epsilon_high >= 0:
        raise ValueError(f"epsilon_high must be a number >= 0, got {epsilon_high!r}")
    log_ratio = torch.where(m, logprobs - old_logprobs, 0).detach()
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=1 + epsilon_high)
    loss = torch.where(m, -weight * adv * logprobs, 0)
    with torch.no_grad():
        any_tok = bool(m.any())
        metrics = {
            "clip_frac_low": masked_mean(torch.zeros_like(ratio), m),
            "clip_frac_high": masked_mean((ratio > 1 + epsilon_high).to(ratio.dtype), m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_min": ratio[m].min() if any_tok else ratio.new_ones(()),
            "ratio_max": ratio[m].max() if any_tok else ratio.new_ones(()),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, m),
        }
    return loss, metrics


def legacy_policy_gradient_loss(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Plain REINFORCE-style ``-A * logp`` per masked token; no ratio, no clip."""
    m = _prepare(logprobs, mask)
    adv = _token_advantages(advantages, logprobs.shape).to(logprobs.dtype)
    return torch.where(m, -adv * logprobs, 0)


def reduce_policy_gradient_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_type: str,
    *,
    max_response_length: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(numerator, weight)`` of one chunk so that chunks combine exactly by summing both.

    A response with no masked token contributes nothing and is not counted in a sequence weight.
    ``seq-mean-token-sum-fixed`` divides each response's token sum by ``max_response_length``
    (the rollout bound), which must be a positive int.
    """
    if per_token_loss.dim() != 2:
        raise ValueError(f"per_token_loss must be [B, T], got shape {tuple(per_token_loss.shape)}")
    m = as_bool_mask(mask, per_token_loss.shape)
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_type == "seq-mean-token-sum-fixed":
        check_max_response_length(max_response_length)
    elif max_response_length is not None and not isinstance(max_response_length, int):
        raise ValueError(f"max_response_length must be an int, got {max_response_length!r}")

    masked = torch.where(m, per_token_loss, 0)
    seq_sum = masked.sum(-1)
    lengths = m.sum(-1)
    has = lengths > 0
    n_seq = has.sum().to(per_token_loss.dtype)
    if loss_type == "token-mean":
        return masked.sum(), lengths.sum().to(per_token_loss.dtype)
    if loss_type == "seq-mean-token-mean":
        per_seq = torch.where(has, seq_sum / lengths.clamp(min=1).to(per_token_loss.dtype), 0)
        return per_seq.sum(), n_seq
    if loss_type == "seq-mean-token-sum":
        return seq_sum.sum(), n_seq
    return seq_sum.sum() / max_response_length, n_seq


def check_max_response_length(value: object) -> int:
    """The rollout bound ``seq-mean-token-sum-fixed`` divides by, checked when a builder runs."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"context.max_response_length (rollout.max_tokens) must be a positive int, got {value!r}"
        )
    return value


def response_bound(loss_type: str, context: object) -> int | None:
    """What a builder passes as ``max_response_length``: the rollout bound for the reduction
    that divides by it (``seq-mean-token-sum-fixed``), checked now; None for the others."""
    if loss_type != "seq-mean-token-sum-fixed":
        return None
    return check_max_response_length(getattr(context, "max_response_length", None))


def token_sum_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_type: str,
    *,
    max_response_length: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``(loss, weight)`` of a TOKEN_SUM objective's chunk: ``loss = numerator / weight``.

    The weight is detached (it is a count). An empty chunk has numerator 0 and weight 0; its
    loss is the numerator itself, so ``loss * weight`` stays 0 instead of ``0 / 0``.
    """
    num, weight = reduce_policy_gradient_loss(
        per_token_loss, mask, loss_type, max_response_length=max_response_length
    )
    weight = weight.detach()
    return (num / weight if float(weight) > 0 else num), weight
