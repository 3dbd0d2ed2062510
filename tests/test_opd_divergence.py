"""Top-k distillation divergences: exact over the full vocabulary at K = V, hand values below it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithm.primitives.divergence import topk_divergence

B, R, V = 3, 4, 7


def _inputs(seed: int, k: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(B, R, V, generator=g, dtype=dtype) * 2).requires_grad_()
    teacher_full = torch.log_softmax(torch.randn(B, R, V, generator=g, dtype=dtype) * 2, -1)
    logp, ids = teacher_full.topk(k, dim=-1)
    mask = torch.rand(B, R, generator=g) < 0.8
    mask[0, 0] = True
    return student, teacher_full, ids, logp, mask


def _full_vocab(student_logits, teacher_full, kind, beta):
    """The divergence written directly over the vocabulary, with no top-k machinery."""
    q = torch.softmax(student_logits, -1)
    p = teacher_full.exp()
    log_q, log_p = torch.log(q), teacher_full
    if kind == "reverse_kl":
        return (q * (log_q - log_p)).sum(-1)
    if kind == "forward_kl":
        return (p * (log_p - log_q)).sum(-1)
    mix = beta * p + (1 - beta) * q
    return beta * (p * (log_p - mix.log())).sum(-1) + (1 - beta) * (q * (log_q - mix.log())).sum(-1)


@pytest.mark.parametrize(
    "kind,beta", [("reverse_kl", 0.5), ("forward_kl", 0.5), ("jsd", 0.5), ("jsd", 0.1)]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_full_vocabulary_top_k_is_exact_in_value_and_gradient(kind, beta, seed):
    student, teacher_full, ids, logp, mask = _inputs(seed, k=V)
    got = topk_divergence(student, ids, logp, mask, kind, beta)
    (g_got,) = torch.autograd.grad(got.sum(), student)
    want = torch.where(mask, _full_vocab(student, teacher_full, kind, beta), 0)
    (g_want,) = torch.autograd.grad(want.sum(), student)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-13)


def test_top_k_with_remainder_matches_a_hand_computation():
    # V = 4; teacher p = (0.5, 0.3, 0.1, 0.1); top-2 keeps ids 0, 1 and a 0.2 remainder.
    teacher = torch.log(torch.tensor([0.5, 0.3, 0.1, 0.1], dtype=torch.float64))
    q = [0.1, 0.2, 0.3, 0.4]
    student = torch.log(torch.tensor(q, dtype=torch.float64)).view(1, 1, 4)
    ids = torch.tensor([[[0, 1]]])
    logp = teacher[:2].view(1, 1, 2)
    mask = torch.ones(1, 1, dtype=torch.bool)
    p3, q3 = [0.5, 0.3, 0.2], [0.1, 0.2, 0.7]
    reverse = sum(b * math.log(b / a) for a, b in zip(p3, q3, strict=True))
    forward = sum(a * math.log(a / b) for a, b in zip(p3, q3, strict=True))
    m3 = [0.25 * a + 0.75 * b for a, b in zip(p3, q3, strict=True)]
    jsd = 0.25 * sum(a * math.log(a / m) for a, m in zip(p3, m3, strict=True)) + 0.75 * sum(
        b * math.log(b / m) for b, m in zip(q3, m3, strict=True)
    )
    for kind, want in (("reverse_kl", reverse), ("forward_kl", forward), ("jsd", jsd)):
        got = topk_divergence(student, ids, logp, mask, kind, beta=0.25)
        assert float(got) == pytest.approx(want, rel=1e-12), kind


def test_masked_positions_are_zero_with_zero_gradient():
    student, _, ids, logp, mask = _inputs(3, k=3)
    out = topk_divergence(student, ids, logp, mask, "forward_kl")
    assert bool((out[~mask] == 0).all())
    (grad,) = torch.autograd.grad(out.sum(), student)
    assert bool((grad[~mask] == 0).all()) and bool(torch.isfinite(grad).all())


def test_student_equal_to_teacher_gives_zero_for_every_k():
    _, teacher_full, _, _, mask = _inputs(4, k=V)
    for k in (1, 3, V):
        logp, ids = teacher_full.topk(k, dim=-1)
        for kind in ("reverse_kl", "forward_kl", "jsd"):
            out = topk_divergence(teacher_full.clone(), ids, logp, mask, kind)
            assert float(out.abs().max()) < 1e-12, (k, kind)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, V),
    beta=st.floats(0.05, 0.95),
)
def test_non_negative_and_jsd_beta_swaps_with_the_arguments(seed, k, beta):
    student, teacher_full, ids, logp, mask = _inputs(seed, k=k)
    for kind in ("reverse_kl", "forward_kl", "jsd"):
        out = topk_divergence(student, ids, logp, mask, kind, beta).detach()
        assert float(out.min()) >= -1e-12
    # JSD_beta(p, q) = JSD_(1-beta)(q, p) at K = V: swap the roles of student and teacher.
    full_ids = teacher_full.argsort(-1, descending=True)
    a = topk_divergence(student, full_ids, teacher_full.gather(-1, full_ids), mask, "jsd", beta)
    s_logp = torch.log_softmax(student.detach(), -1)
    b = topk_divergence(teacher_full, full_ids, s_logp.gather(-1, full_ids), mask, "jsd", 1 - beta)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_float32_top_k_with_remainder_is_finite_when_teacher_mass_is_all_in_top_k():
    logits = torch.full((1, 1, 5), -1e4)
    logits[..., 0] = 0.0  # the teacher puts all its mass on id 0
    teacher = torch.log_softmax(logits, -1)
    logp, ids = teacher.topk(2, dim=-1)
    student = torch.zeros(1, 1, 5, requires_grad=True)
    out = topk_divergence(student, ids, logp, torch.ones(1, 1, dtype=torch.bool), "reverse_kl")
    (grad,) = torch.autograd.grad(out.sum(), student)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize(
    "change,match",
    [
        ({"kind": "tv"}, "divergence must be one of"),
        ({"kind": "jsd", "beta": 1.0}, "beta must be in"),
        ({"ids": torch.zeros(B, R, V + 1, dtype=torch.long)}, "top-k width"),
        ({"ids": torch.zeros(B, R, 2, dtype=torch.int32)}, "int64"),
    ],
)
def test_bad_arguments_raise_one_line(change, match):
    student, _, ids, logp, mask = _inputs(0, k=2)
    kwargs = {"kind": "reverse_kl", "beta": 0.5, "ids": ids}
    kwargs.update(change)
    ids = kwargs.pop("ids")
    lp = logp if ids.shape == logp.shape else torch.zeros(ids.shape, dtype=logp.dtype)
    with pytest.raises(ValueError, match=match):
        topk_divergence(student, ids, lp, mask, **kwargs)
