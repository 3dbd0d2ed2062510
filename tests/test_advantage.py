"""Group-relative advantages and shared-prefix masking, hand-computed."""

from __future__ import annotations

import pytest
import torch

from posttrain.algorithm.annotators.advantage import group_advantages, shared_prefix_mask
from posttrain.algorithm.primitives.divergence import kl_penalty

D = torch.float64


def test_grpo_and_unbiased_estimators():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5], dtype=D)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, stats = group_advantages(rewards, groups, group_size=2)
    std = (0.5**2 * 2 / 1) ** 0.5  # Bessel: sum sq / (n-1)
    assert adv[:2].tolist() == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6)])
    assert adv[4:].tolist() == [0.0, 0.0]
    assert stats["zero_variance_group_frac"] == pytest.approx(1 / 3)
    unb, _ = group_advantages(rewards, groups, group_size=2, estimator="unbiased")
    assert unb.tolist() == [0.5, -0.5, 0.5, -0.5, 0.0, 0.0]


def test_groups_may_be_interleaved():
    rewards = torch.tensor([3.0, 1.0, 2.0, 5.0], dtype=D)
    adv, _ = group_advantages(
        rewards, torch.tensor([7, 9, 7, 9]), group_size=2, estimator="unbiased"
    )
    assert adv.tolist() == [0.5, -2.0, -0.5, 2.0]


def test_incomplete_and_singleton_groups_are_errors():
    r = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="group 1 has 1 member"):
        group_advantages(r, torch.tensor([0, 0, 1]), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(r, torch.tensor([0, 1, 2]), group_size=1)
    with pytest.raises(ValueError, match="finite"):
        group_advantages(
            torch.tensor([0.0, float("nan")], dtype=D), torch.tensor([0, 0]), group_size=2
        )


def test_shared_prefix_mask():
    ids = torch.tensor(
        [[5, 6, 7, 0], [5, 6, 8, 9], [4, 4, 4, 0], [4, 4, 4, 0], [1, 2, 0, 0], [3, 2, 0, 0]]
    )
    mask = ids != 0
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    out = shared_prefix_mask(ids, mask, groups)
    assert out.tolist() == [
        [False, False, True, False],
        [False, False, True, True],
        [False, False, False, False],  # identical responses: nothing left to learn from
        [False, False, False, False],
        [True, True, False, False],  # no common prefix
        [True, True, False, False],
    ]


def test_kl_estimators_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0]], dtype=D)
    m = torch.tensor([[True, False]])
    d = -0.5
    assert kl_penalty(logp, ref, m, "k1").tolist() == [[0.5, 0.0]]
    assert kl_penalty(logp, ref, m, "k2").tolist() == [[0.125, 0.0]]
    assert kl_penalty(logp, ref, m, "k3")[0, 0].item() == pytest.approx(
        torch.tensor(d).exp().item() - 1 - d
    )
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(logp, ref, m, "k4")


def test_equal_rewards_are_zero_variance_despite_rounding():
    # The mean of five 0.22s is not exactly 0.22 in float64; the group must still count as flat.
    adv, stats = group_advantages(
        torch.full((5,), 0.22, dtype=D), torch.zeros(5, dtype=torch.long), group_size=5
    )
    assert adv.tolist() == [0.0] * 5 and stats["zero_variance_group_frac"] == 1.0
    rewards = torch.tensor([0.2, 0.2, 0.2, 0.0, 1.0, 0.0], dtype=D)
    adv, stats = group_advantages(rewards, torch.tensor([1, 1, 1, 2, 2, 2]), group_size=3)
    assert adv[:3].tolist() == [0.0] * 3 and stats["zero_variance_group_frac"] == 0.5
