"""Any partition of rows into chunks, summing numerators and weights, equals the whole batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithm.primitives.policy_gradient import (
    LOSS_TYPES,
    clipped_policy_gradient_loss,
    reduce_policy_gradient_loss,
)

D = torch.float64


@st.composite
def batches(draw):
    b = draw(st.integers(1, 7))
    t = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    # A partition: sorted cut points between 1 and b-1.
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, b - 1)), max_size=3)))) if b > 1 else []
    loss_type = draw(st.sampled_from(LOSS_TYPES))
    level = draw(st.sampled_from(["token", "sequence"]))
    return b, t, seed, cuts, loss_type, level


def _per_token(logp, old, adv, mask, level):
    out, _ = clipped_policy_gradient_loss(
        logp, old, adv, mask, epsilon_low=0.1, epsilon_high=0.15, importance_sampling_level=level
    )
    return out


@settings(max_examples=60, deadline=None)
@given(batches())
def test_chunked_sum_equals_whole(case):
    b, t, seed, cuts, loss_type, level = case
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g, dtype=D) * 2).requires_grad_(True)
    old = logp.detach() + (torch.rand(b, t, generator=g, dtype=D) - 0.5) * 0.5
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(b, generator=g, dtype=D)
    max_len = t + 2

    num, w = reduce_policy_gradient_loss(
        _per_token(logp, old, adv, mask, level), mask, loss_type, max_response_length=max_len
    )
    whole = num / w if w > 0 else num
    whole.backward()
    g_whole = logp.grad.clone()
    logp.grad = None

    bounds = [0, *cuts, b]
    nums, ws = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        n_k, w_k = reduce_policy_gradient_loss(
            _per_token(logp[lo:hi], old[lo:hi], adv[lo:hi], mask[lo:hi], level),
            mask[lo:hi],
            loss_type,
            max_response_length=max_len,
        )
        nums.append(n_k)
        ws.append(w_k)
    total_w = torch.stack(ws).sum()
    split = torch.stack(nums).sum() / total_w if total_w > 0 else torch.stack(nums).sum()
    split.backward()
    assert total_w.item() == w.item()
    assert split.item() == pytest.approx(whole.item(), abs=1e-13)
    assert torch.allclose(logp.grad, g_whole, atol=1e-13, rtol=0)
