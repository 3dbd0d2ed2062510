"""GSPO: the sequence-level ratio as a sub-knob of the clipped surrogate."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algorithm.primitives.policy_gradient import (
    LOSS_TYPES,
    clipped_policy_gradient_loss,
    reduce_policy_gradient_loss,
)

D = torch.float64


def _setup(seed=0, b=5, t=7):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g, dtype=D) * 3).requires_grad_(True)
    lengths = torch.tensor([7, 3, 1, 5, 0])[:b]
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(b, generator=g, dtype=D)
    return logp, mask, adv, g


def _loss_and_grad(logp, old, adv, mask, level, loss_type, **kw):
    if logp.grad is not None:
        logp.grad = None
    per_tok, metrics = clipped_policy_gradient_loss(
        logp, old, adv, mask, epsilon_low=kw.get("el", 0.2), epsilon_high=kw.get("eh", 0.28),
        importance_sampling_level=level,
    )  # fmt: skip
    num, w = reduce_policy_gradient_loss(per_tok, mask, loss_type, max_response_length=7)
    loss = num / w
    loss.backward()
    return loss.detach(), logp.grad.clone(), metrics


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_on_policy_token_and_sequence_agree_exactly(loss_type):
    logp, mask, adv, _ = _setup()
    old = logp.detach().clone()
    v_tok, g_tok, _ = _loss_and_grad(logp, old, adv, mask, "token", loss_type)
    v_seq, g_seq, m_seq = _loss_and_grad(logp, old, adv, mask, "sequence", loss_type)
    assert torch.equal(v_tok, v_seq)
    assert torch.equal(g_tok, g_seq)
    assert m_seq["seq_clip_frac"].item() == 0.0
    assert m_seq["seq_log_ratio_abs_mean"].item() == 0.0


def _paper_objective(logp, old, adv, mask, el, eh):
    """GSPO as published: one ratio s_i = exp(mean_t(logp - old)) per response, full gradient."""
    lengths = mask.sum(-1)
    has = lengths > 0
    z = torch.where(mask, logp - old, 0).sum(-1) / lengths.clamp(min=1)
    s = torch.exp(z)
    per_seq = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - el, 1 + eh))
    clipped = ((s < 1 - el) & (adv < 0)) | ((s > 1 + eh) & (adv > 0))
    return torch.where(has, per_seq, 0).sum() / has.sum(), (clipped & has)


@pytest.mark.parametrize("seed", range(5))
def test_gspo_token_form_equals_paper_sequence_objective(seed):
    logp, mask, adv, g = _setup(seed)
    # Off-policy by up to ~±0.3 per token so that some responses clip and some do not.
    old = (logp.detach() + (torch.rand(logp.shape, generator=g, dtype=D) - 0.5) * 0.6).clone()
    el, eh = 0.05, 0.08
    v_ours, g_ours, metrics = _loss_and_grad(
        logp, old, adv, mask, "sequence", "seq-mean-token-mean", el=el, eh=eh
    )
    logp.grad = None
    v_paper, clipped = _paper_objective(logp, old, adv, mask, el, eh)
    v_paper.backward()
    assert v_ours.item() == pytest.approx(v_paper.item(), abs=1e-14)
    assert torch.allclose(g_ours, logp.grad, atol=1e-14, rtol=0)
    has = mask.any(-1)
    assert metrics["seq_clip_frac"].item() == pytest.approx(clipped.sum().item() / has.sum().item())


def test_sequence_log_ratio_clamp_acts_upward_only():
    t = 4
    mask = torch.ones(2, t, dtype=torch.bool)
    old = torch.zeros(2, t, dtype=D)
    # Response 0: z = +20 (clamped to 10); response 1: z = -20 (left alone).
    logp = torch.stack([torch.full((t,), 20.0, dtype=D), torch.full((t,), -20.0, dtype=D)])
    adv = torch.tensor([-1.0, 1.0], dtype=D)
    loss, metrics = clipped_policy_gradient_loss(
        logp,
        old,
        adv,
        mask,
        epsilon_low=0.2,
        epsilon_high=0.2,
        importance_sampling_level="sequence",
    )
    assert loss[0, 0].item() == pytest.approx(math.exp(10.0), rel=1e-14)
    assert loss[1, 0].item() == pytest.approx(-math.exp(-20.0), rel=1e-12)
    assert metrics["seq_log_ratio_abs_mean"].item() == pytest.approx(20.0)
