"""Group-relative advantages and shared-prefix masking, hand-computed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algorithm.annotators.advantage import group_advantages, shared_prefix_mask
from posttrain.algorithm.primitives.divergence import kl_penalty

D = torch.float64


def test_grpo_and_dr_grpo_estimators():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5], dtype=D)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, stats = group_advantages(rewards, groups, group_size=2)
    std = (0.5**2 * 2 / 1) ** 0.5  # Bessel: sum sq / (n-1)
    assert adv[:2].tolist() == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6)])
    assert adv[4:].tolist() == [0.0, 0.0]
    assert stats["zero_variance_group_frac"] == pytest.approx(1 / 3)
    unb, _ = group_advantages(rewards, groups, group_size=2, estimator="dr_grpo")
    assert unb.tolist() == [0.5, -0.5, 0.5, -0.5, 0.0, 0.0]


def test_groups_may_be_interleaved():
    rewards = torch.tensor([3.0, 1.0, 2.0, 5.0], dtype=D)
    adv, _ = group_advantages(
        rewards, torch.tensor([7, 9, 7, 9]), group_size=2, estimator="dr_grpo"
    )
    assert adv.tolist() == [0.5, -2.0, -0.5, 2.0]


# Two groups of unequal size: g0 = [1, 0, 0] (mean 1/3, Bessel var 1/3), g1 = [2, 4] (mean 3,
# var 2). Batch: mean 1.4, squared deviations 0.16 + 1.96 + 1.96 + 0.36 + 6.76 = 11.2, var 2.8.
UNEQUAL = (torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0], dtype=D), torch.tensor([0, 0, 0, 1, 1]))
EPS = 1e-6
S0, S1, SB = (1 / 3) ** 0.5, 2**0.5, 2.8**0.5
DEV = [2 / 3, -1 / 3, -1 / 3, -1.0, 1.0]
LOO = [1.0, -0.5, -0.5, -2.0, 2.0]  # r_i - mean of the other members, by hand


@pytest.mark.parametrize(
    ("estimator", "scaling", "want"),
    [
        ("grpo", "group", [d / (s + EPS) for d, s in zip(DEV, [S0] * 3 + [S1] * 2, strict=True)]),
        ("grpo", "batch", [d / (SB + EPS) for d in DEV]),
        ("dr_grpo", "group", DEV),  # dr_grpo reads no scaling
        ("rloo", "none", LOO),
        ("rloo", "group", [d / (s + EPS) for d, s in zip(LOO, [S0] * 3 + [S1] * 2, strict=True)]),
        ("rloo", "batch", [d / (SB + EPS) for d in LOO]),
        ("reinforce_pp", "none", [(r - 1.4) / (SB + EPS) for r in [1, 0, 0, 2, 4]]),
    ],
)
def test_estimators_on_groups_of_unequal_size(estimator, scaling, want):
    rewards, groups = UNEQUAL
    adv, _ = group_advantages(
        rewards, groups, group_size=None, estimator=estimator, scaling=scaling, eps=EPS
    )
    assert adv.tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(-3, 3), min_size=2, max_size=5).map(lambda g: [x / 2 for x in g]),
        min_size=1,
        max_size=4,
    )
)
def test_rloo_is_the_leave_one_out_baseline(groups):
    rewards = torch.tensor([r for g in groups for r in g], dtype=D)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    adv, _ = group_advantages(rewards, ids, group_size=None, estimator="rloo", scaling="none")
    want = [r - (sum(g) - r) / (len(g) - 1) for g in groups for r in g]
    assert adv.tolist() == pytest.approx(want, abs=1e-12)


def test_flat_groups_and_flat_batches_have_zero_advantage():
    rewards = torch.tensor([0.3, 0.3, 1.0, 0.0], dtype=D)
    groups = torch.tensor([0, 0, 1, 1])
    for est in ("grpo", "dr_grpo", "rloo"):
        adv, _ = group_advantages(rewards, groups, group_size=2, estimator=est, scaling="batch")
        assert adv[:2].tolist() == [0.0, 0.0]
    flat, _ = group_advantages(
        torch.full((4,), 0.3, dtype=D), groups, group_size=2, estimator="reinforce_pp"
    )
    assert flat.tolist() == [0.0] * 4


def test_incomplete_and_singleton_groups_are_errors():
    r = torch.zeros(3, dtype=D)
    with pytest.raises(ValueError, match="group 1 has 1 member"):
        group_advantages(r, torch.tensor([0, 0, 1]), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(r, torch.tensor([0, 1, 2]), group_size=1)
    with pytest.raises(ValueError, match="group 1 has 1 member.*a baseline needs >= 2"):
        group_advantages(r, torch.tensor([0, 0, 1]), group_size=None)
    with pytest.raises(ValueError, match="estimator must be one of"):
        group_advantages(r[:2], torch.tensor([0, 0]), group_size=2, estimator="unbiased")
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
