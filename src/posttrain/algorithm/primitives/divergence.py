"""Divergences between the policy and another model: sampled KL estimators and distillation.

Sampled estimators (``kl_penalty``): with ``d = ref_logprobs - logprobs`` on tokens sampled from
the policy (Schulman's estimators of KL(pi || ref)): k1 = ``-d`` (unbiased, can be negative),
k2 = ``d**2 / 2`` (low variance, biased), k3 = ``exp(d) - 1 - d`` (unbiased and non-negative;
GRPO's default KL anchor).

Distribution divergences (``topk_divergence``): at every response position, a divergence between
the student's and the teacher's whole next-token distributions, known to the student through the
teacher's top-k log-probs. See that function for the remainder bucket.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.algorithm.primitives._checks import as_bool_mask, check_finite, check_shape
from posttrain.algorithm.primitives.choices import DIVERGENCES, KLEstimator


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


def _student_categories(student_logits: Tensor, ids: Tensor, exact: bool) -> Tensor:
    """Student log-probs of the teacher's k ids, plus the log-mass of every other id unless the
    k ids cover the vocabulary. The rest is a logsumexp over the logits that are not among the
    ids (no ``1 - sum`` cancellation), so its gradient reaches every token of the remainder."""
    lse = torch.logsumexp(student_logits, dim=-1, keepdim=True)
    picked = torch.gather(student_logits, -1, ids) - lse
    if exact:
        return picked
    others = student_logits.scatter(-1, ids, float("-inf"))
    rest = torch.logsumexp(others, dim=-1, keepdim=True) - lse
    return torch.cat([picked, rest], dim=-1)


def _teacher_categories(teacher_logprobs: Tensor, exact: bool) -> Tensor:
    """The teacher's k log-probs plus the log of the mass it puts elsewhere, ``1 - sum p_k``.

    That mass is floored at the dtype's smallest normal number: where the top k hold all the
    mass up to rounding, the remainder's true value is below what the top-k sum can resolve.
    """
    if exact:
        return teacher_logprobs
    lse = torch.logsumexp(teacher_logprobs, dim=-1, keepdim=True).clamp(max=0)
    tiny = torch.finfo(teacher_logprobs.dtype).tiny
    rest = torch.log((-torch.expm1(lse)).clamp(min=tiny))
    return torch.cat([teacher_logprobs, rest], dim=-1)


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) over the last dim, from log-probs."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def topk_divergence(
    student_logits: Tensor,
    teacher_ids: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    kind: str = "reverse_kl",
    beta: float = 0.5,
) -> Tensor:
    """``[B, R]`` divergence between student and teacher next-token distributions per position.

    ``student_logits`` ``[B, R, V]`` (already divided by the loss temperature) predict response
    token ``t`` at position ``t``; ``teacher_ids``/``teacher_logprobs`` ``[B, R, K]`` are the
    teacher's top-k token ids and their (full-vocabulary) log-probs. Both distributions are
    compared over K + 1 categories: the k ids and one remainder bucket holding all other ids'
    mass. With K = V the ids cover the vocabulary, there is no bucket, and the value is exactly
    the full-vocabulary divergence. ``kind``: ``reverse_kl`` = KL(student || teacher) (mode
    seeking, the default), ``forward_kl`` = KL(teacher || student), ``jsd`` = the generalised
    Jensen-Shannon divergence ``beta*KL(p || m) + (1-beta)*KL(q || m)``, ``m = beta*p + (1-beta)*q``
    with p the teacher, q the student (GKD's convention; 0 < beta < 1). Gradients flow through the
    student only; masked positions are exactly 0.
    """
    if student_logits.dim() != 3:
        raise ValueError(f"student_logits must be [B, R, V], got {tuple(student_logits.shape)}")
    b, r, v = student_logits.shape
    if teacher_ids.dim() != 3 or tuple(teacher_ids.shape[:2]) != (b, r):
        raise ValueError(f"teacher_ids must be [B={b}, R={r}, K], got {tuple(teacher_ids.shape)}")
    k = teacher_ids.shape[-1]
    if not 1 <= k <= v:
        raise ValueError(f"teacher top-k width must be in [1, V={v}], got {k}")
    if teacher_ids.dtype != torch.int64:
        raise ValueError(f"teacher_ids must be int64, got {teacher_ids.dtype}")
    check_shape("teacher_logprobs", teacher_logprobs, teacher_ids.shape)
    check_finite("teacher_logprobs", teacher_logprobs)
    if kind not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")
    if kind == "jsd" and not 0 < beta < 1:
        raise ValueError(f"jsd beta must be in (0, 1), got {beta}")
    m = as_bool_mask(mask, (b, r))
    logits = student_logits
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    exact = k == v
    log_q = _student_categories(logits, teacher_ids, exact)
    log_p = _teacher_categories(teacher_logprobs.to(log_q.dtype), exact)
    if kind == "reverse_kl":
        out = _kl(log_q, log_p)
    elif kind == "forward_kl":
        out = _kl(log_p, log_q)
    else:
        log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log1p(-beta))
        out = beta * _kl(log_p, log_m) + (1 - beta) * _kl(log_q, log_m)
    return torch.where(m, out, 0)
