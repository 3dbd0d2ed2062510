"""Truncated importance sampling for the sampler-trainer gap, against hand-computed values."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import random_batch, tiny_llama

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.rollout_correction import (
    logprob_abs_diff,
    logprob_abs_diff_max,
    truncated_is_weights,
)
from posttrain.config import RLConfig
from posttrain.data.logprobs import response_logprobs


def test_weights_hand_computed():
    old = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.1)]])
    mask = torch.tensor([[1, 1, 0]])
    w = truncated_is_weights(old, rollout, mask, cap=1.5)
    # 0.5/0.25 = 2 -> capped at 1.5; 0.2/0.4 = 0.5; padding -> 0 (its ratio 9 never counts)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.5, 0.0]]))
    w = truncated_is_weights(old, rollout, mask, cap=10.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0]]))


def test_weights_are_detached_and_padding_never_leaks_nan():
    old = torch.tensor([[0.0, float("nan")]], requires_grad=True)
    rollout = torch.tensor([[-1.0, float("inf")]])
    w = truncated_is_weights(old, rollout, torch.tensor([[1, 0]]), cap=2.0)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0]]))


def test_abs_diff_hand_computed_and_empty_mask():
    a = torch.tensor([[-1.0, -2.0, -3.0]])
    b = torch.tensor([[-1.5, -1.0, 7.0]])
    torch.testing.assert_close(
        logprob_abs_diff(a, b, torch.tensor([[1, 1, 0]])), torch.tensor(0.75)
    )
    assert float(logprob_abs_diff(a, b, torch.zeros(1, 3))) == 0.0
    # the max: 1.0 (the padded token's gap of 10 never counts)
    assert float(logprob_abs_diff_max(a, b, torch.tensor([[1, 1, 0]]))) == 1.0
    assert float(logprob_abs_diff_max(a, b, torch.zeros(1, 3))) == 0.0


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_cap_must_be_positive(cap):
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap)


def _objective(cap: float):
    rl = RLConfig(rollout_is_cap=cap, temperature=1.0)
    return make_objective(rl, SimpleNamespace(max_response_length=5))


def test_objective_weights_each_token_of_the_surrogate():
    """On-policy (ratio 1, no clip) the per-token loss is -A; with the cap it is -A * w."""
    model = tiny_llama(seed=1)
    batch = random_batch(seed=3)
    g = torch.Generator().manual_seed(0)
    noise = -3 * torch.rand(batch.response_mask.shape, generator=g, dtype=torch.float64)
    batch = dataclasses.replace(
        batch, rollout_logprobs=torch.where(batch.response_mask, noise, 0.0)
    )
    plain, capped = _objective(0.0), _objective(1.3)
    for obj in (plain, capped):
        obj.old_logp_cache.follow_policy(batch)  # one update: π_old is the current forward
    loss0, m0 = plain(model, batch)
    loss1, m1 = capped(model, batch)
    old = response_logprobs(model, batch).detach()
    m = batch.response_mask
    w = torch.where(m, torch.exp(old - batch.rollout_logprobs).clamp(max=1.3), 0.0)
    adv = batch.advantages[:, None].expand_as(old)
    expected = torch.where(m, -adv * w, 0.0).sum() / m.sum()
    torch.testing.assert_close(loss1.double(), expected.double())
    torch.testing.assert_close(loss0.double(), (torch.where(m, -adv, 0.0).sum() / m.sum()).double())
    diff = torch.where(m, (old - batch.rollout_logprobs).abs(), 0.0).sum() / m.sum()
    torch.testing.assert_close(float(m1["rollout_logprob_abs_diff"]), float(diff))
    assert "rollout_is_weight_mean" in m1 and "rollout_is_weight_mean" not in m0
    assert capped.identity["rollout_is_cap"] == 1.3 and "rollout_is_cap" not in plain.identity


def test_is_weight_max_and_truncated_fraction_by_hand():
    """Rollout log-probs 0.5 below π_old on even tokens, 0.5 above on odd ones: the weight is
    min(e^0.5, 1.3) = 1.3 (truncated) or e^-0.5, so its max is 1.3 and the truncated fraction
    is the share of even masked tokens."""
    model = tiny_llama(seed=1)
    batch = random_batch(seed=3)
    obj = _objective(1.3)
    obj.old_logp_cache.follow_policy(batch)
    old = response_logprobs(model, batch).detach()
    even = (torch.arange(old.shape[1]) % 2 == 0).expand_as(old)
    rollout = torch.where(even, old - 0.5, old + 0.5)
    m = batch.response_mask
    batch = dataclasses.replace(batch, rollout_logprobs=torch.where(m, rollout, 0.0))
    _, metrics = obj(model, batch)
    assert float(metrics["rollout_is_weight_max"]) == pytest.approx(1.3)
    frac = float((even & m).sum() / m.sum())
    assert 0 < frac < 1
    assert float(metrics["rollout_is_truncated_frac"]) == pytest.approx(frac)
    mean = float(torch.where(even, 1.3, torch.exp(torch.tensor(-0.5)))[m].mean())
    assert float(metrics["rollout_is_weight_mean"]) == pytest.approx(mean, rel=1e-5)
