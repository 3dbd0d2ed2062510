"""Hand-computed values for every branch of the surrogate and every loss type."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.algorithm.primitives.policy_gradient import (
    clipped_policy_gradient_loss,
    legacy_policy_gradient_loss,
    reduce_policy_gradient_loss,
    sequence_log_ratio,
)

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


def test_token_level_branches_hand_computed():
    # Ratios 1.1 (inside), 0.5 (below 1-0.2), 1.5 (above 1+0.3); advantages chosen per branch.
    ratios = [1.1, 0.5, 1.5, 0.5, 1.5]
    adv = t(2.0, -1.0, 3.0, 1.0, -2.0)
    logp = torch.log(t(*ratios)).reshape(5, 1)
    old = torch.zeros(5, 1, dtype=D)
    mask = torch.ones(5, 1, dtype=torch.bool)
    loss, m = clipped_policy_gradient_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.3)
    expected = [
        -2.0 * 1.1,  # inside the trust region: -A r
        1.0 * 0.8,  # A<0, r<0.8: max(0.5, 0.8) -> clipped low
        -3.0 * 1.3,  # A>0, r>1.3: max(-4.5, -3.9) -> clipped high
        -1.0 * 0.5,  # A>0, r low: max(-0.5, -0.8) -> unclipped
        2.0 * 1.5,  # A<0, r high: max(3.0, 2.6) -> unclipped (no upper bound on a bad action)
    ]
    assert loss.squeeze(1).tolist() == pytest.approx(expected, abs=1e-12)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 5)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["ratio_min"].item() == pytest.approx(0.5)
    assert m["ratio_max"].item() == pytest.approx(1.5)
    assert m["ratio_mean"].item() == pytest.approx(sum(ratios) / 5)
    k3 = sum((r - 1) - math.log(r) for r in ratios) / 5
    assert m["approx_kl"].item() == pytest.approx(k3)


def test_dual_clip_caps_negative_advantage_loss():
    logp = torch.log(t(5.0, 2.0, 5.0)).reshape(3, 1)
    old = torch.zeros(3, 1, dtype=D)
    adv = t(-1.0, -1.0, 1.0)
    mask = torch.ones(3, 1, dtype=torch.bool)
    loss, m = clipped_policy_gradient_loss(
        logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.2, lower_bound_ratio=3.0
    )
    # r=5, A=-1: max(5, 1.2)=5, capped at -A*3 = 3; r=2: 2 < 3 stays; A>0 untouched: max(-5,-1.2)
    assert loss.squeeze(1).tolist() == pytest.approx([3.0, 2.0, -1.2])
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 3)
    # Gradient through the capped token is zero.
    lp = logp.clone().requires_grad_(True)
    out, _ = clipped_policy_gradient_loss(
        lp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.2, lower_bound_ratio=3.0
    )
    out.sum().backward()
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[1, 0].item() == pytest.approx(2.0)  # d(-A r)/dlogp = -A r = 2


def test_masked_positions_are_exact_zero_and_do_not_leak_nan():
    logp = t([0.0, 500.0], [0.1, -0.2]).requires_grad_(True)
    old = t([0.0, -500.0], [0.0, 0.0])
    mask = torch.tensor([[1, 0], [1, 1]])
    adv = t(1.0, -1.0)
    loss, _ = clipped_policy_gradient_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.2)
    assert loss[0, 1].item() == 0.0
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1].item() == 0.0


def test_legacy_pg():
    logp = t([-1.0, -2.0], [-0.5, -0.25])
    mask = torch.tensor([[True, False], [True, True]])
    out = legacy_policy_gradient_loss(logp, t(2.0, -1.0), mask)
    assert out.tolist() == [[2.0, 0.0], [-0.5, -0.25]]


LOSSES = t([1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "loss_type,num,weight",
    [
        ("token-mean", 10.0, 4.0),
        ("seq-mean-token-mean", 2.0 + 4.0, 2.0),  # row 3 is empty: not counted
        ("seq-mean-token-sum", 10.0, 2.0),
        ("seq-mean-token-sum-fixed", 10.0 / 8, 2.0),
    ],
)
def test_reductions_hand_computed(loss_type, num, weight):
    n, w = reduce_policy_gradient_loss(LOSSES, MASK, loss_type, max_response_length=8)
    assert n.item() == pytest.approx(num)
    assert w.item() == weight


@pytest.mark.parametrize("bad", [True, 0, -3, 2.5, None])
def test_fixed_reduction_rejects_bad_bound(bad):
    with pytest.raises(ValueError, match="max_response_length"):
        reduce_policy_gradient_loss(
            LOSSES, MASK, "seq-mean-token-sum-fixed", max_response_length=bad
        )


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="loss_type"):
        reduce_policy_gradient_loss(LOSSES, MASK, "sum")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"old_logprobs": torch.zeros(2, 2, dtype=D)}, "old_logprobs has shape"),
        ({"advantages": torch.zeros(3, dtype=D)}, "advantages has shape"),
        ({"mask": torch.ones(2, 2)}, "mask has shape"),
        ({"mask": torch.full((2, 3), 2.0)}, "mask must be boolean"),
        ({"logprobs": t([0.0, float("nan"), 0.0], [0.0, 0.0, 0.0])}, "logprobs contains NaN"),
        ({"advantages": t(float("inf"), 0.0)}, "advantages contains NaN"),
        ({"lower_bound_ratio": 0.5}, "lower_bound_ratio"),
        ({"lower_bound_ratio": 1.0}, "lower_bound_ratio"),
        ({"importance_sampling_level": "group"}, "importance_sampling_level"),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, match):
    args = {
        "logprobs": torch.zeros(2, 3, dtype=D),
        "old_logprobs": torch.zeros(2, 3, dtype=D),
        "advantages": torch.zeros(2, dtype=D),
        "mask": torch.ones(2, 3, dtype=torch.bool),
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        clipped_policy_gradient_loss(**args)


def test_sequence_level_refuses_dual_clip_and_token_advantages():
    z = torch.zeros(2, 3, dtype=D)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="dual clip"):
        clipped_policy_gradient_loss(
            z, z, torch.zeros(2, dtype=D), m, epsilon_low=0.2, epsilon_high=0.2,
            lower_bound_ratio=2.0, importance_sampling_level="sequence",
        )  # fmt: skip
    with pytest.raises(ValueError, match="per-token advantages"):
        clipped_policy_gradient_loss(
            z, z, z, m, epsilon_low=0.2, epsilon_high=0.2, importance_sampling_level="sequence"
        )


def test_sequence_log_ratio_value_and_gradient():
    logp = t([-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]).requires_grad_(True)
    old = t([-1.5, -2.5, 0.0], [-1.0, -2.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = sequence_log_ratio(logp, old, mask)
    assert out.flatten().tolist() == pytest.approx([0.5, 0.5, 0.0, 1 / 3, 1 / 3, 1 / 3])
    (out * t([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])).sum().backward()
    # Gradient reaches only the token's own logprob, with coefficient 1.
    assert logp.grad.tolist() == [[1.0, 2.0, 0.0], [4.0, 5.0, 6.0]]
