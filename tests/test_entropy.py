"""Per-token policy entropy: hand values, chunking, gradients, and the clipped objective's bonus."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import random_batch, tiny_llama

from posttrain.algorithm.grpo import identity_of, make_objective
from posttrain.algorithm.primitives.objective import OBJECTIVE_WEIGHT_SUM
from posttrain.data import logprobs as lp

D = torch.float64


def _rl(**kw):
    base = dict(
        grpo_surrogate="clipped", importance_sampling_level="token", epsilon_low=0.2,
        epsilon_high=0.2, lower_bound_ratio=0.0, temperature=1.0, loss_type="token-mean",
        kl_beta=0.0, kl_estimator="k3", entropy_coef=0.0, rollout_is_cap=0.0,
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


def test_entropy_by_hand():
    # logits (0, ln 3): p = (1/4, 3/4). At temperature 2 the logits halve: p ∝ (1, sqrt 3).
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=D)
    logp, ent = lp.token_logprobs_and_entropy(logits, torch.tensor([[1]]), 1.0, "metric")
    assert logp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    q = 1 / (1 + math.sqrt(3))
    _, ent2 = lp.token_logprobs_and_entropy(logits, torch.tensor([[0]]), 2.0, "metric")
    assert ent2.item() == pytest.approx(-(q * math.log(q) + (1 - q) * math.log(1 - q)))


@pytest.mark.parametrize("dtype", [D, torch.bfloat16])
def test_chunked_values_and_gradients_match_the_whole_computation(monkeypatch, dtype):
    torch.manual_seed(0)
    base = torch.randn(3, 5, 11, dtype=D)
    targets = torch.randint(0, 11, (3, 5))

    def run(chunk: int):
        monkeypatch.setattr(lp, "CHUNK_ELEMENTS", chunk * 11)
        x = base.to(dtype).requires_grad_(True)
        logp, ent = lp.token_logprobs_and_entropy(x, targets, 0.7, "grad")
        (logp.sum() + 0.3 * ent.sum()).backward()
        return logp.detach(), ent.detach(), x.grad

    whole, chunked = run(1000), run(4)  # 15 positions: chunks of 4, 4, 4, 3
    for a, b in zip(whole, chunked, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Reference: full log_softmax and Categorical entropy on float64.
    ref = torch.log_softmax(base.to(dtype).to(D) / 0.7, -1)
    torch.testing.assert_close(chunked[0].to(D), ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    want = torch.distributions.Categorical(logits=ref).entropy()
    tol = 1e-12 if dtype == D else 1e-5
    torch.testing.assert_close(chunked[1].to(D), want, rtol=tol, atol=tol)


def test_metric_entropy_has_no_graph():
    x = torch.randn(2, 3, 5, dtype=D, requires_grad=True)
    logp, ent = lp.token_logprobs_and_entropy(x, torch.zeros(2, 3, dtype=torch.long), 1.0, "metric")
    assert logp.requires_grad and not ent.requires_grad
    with pytest.raises(ValueError, match="entropy must be"):
        lp.token_logprobs_and_entropy(x, torch.zeros(2, 3, dtype=torch.long), 1.0, None)


def _loss_and_grads(model, batch, **knobs):
    obj = make_objective(_rl(**knobs), SimpleNamespace(max_response_length=5))
    obj.old_logp_cache.capture(model, batch)
    model.zero_grad()
    loss, metrics = obj(model, batch)
    loss.backward()
    return loss.detach(), metrics, [p.grad.clone() for p in model.parameters()]


def test_entropy_bonus_subtracts_coef_times_the_reduced_entropy():
    model, batch = tiny_llama(), random_batch()
    loss0, m0, g0 = _loss_and_grads(model, batch)
    loss1, m1, g1 = _loss_and_grads(model, batch, entropy_coef=0.1)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    r = batch.response_width
    ent = torch.distributions.Categorical(logits=logits[:, -(r + 1) : -1]).entropy()
    mask = batch.response_mask
    token_mean = ent[mask].mean()
    assert m0["entropy"].item() == pytest.approx(token_mean.item(), rel=1e-10)
    assert m1["entropy"].item() == pytest.approx(token_mean.item(), rel=1e-10)
    assert loss1.item() == pytest.approx(loss0.item() - 0.1 * token_mean.item(), rel=1e-10)
    assert m1[OBJECTIVE_WEIGHT_SUM] == m0[OBJECTIVE_WEIGHT_SUM]
    # The bonus changes the gradient (it pushes entropy up), the metric alone does not.
    assert any(not torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    assert "entropy_coef" not in identity_of(_rl())
    assert identity_of(_rl(entropy_coef=0.1))["entropy_coef"] == 0.1


def test_legacy_pg_reports_entropy():
    model, batch = tiny_llama(), random_batch()
    obj = make_objective(_rl(grpo_surrogate="legacy_pg"), SimpleNamespace(max_response_length=5))
    _, metrics = obj(model, batch)
    assert metrics["entropy"].item() > 0
    assert set(obj.metric_adapter.adapt(metrics)) >= {"train/pg/entropy"}


def test_head_chunked_entropy_matches_the_whole_forward():
    model, batch = tiny_llama(), random_batch()

    def run(chunk_elements: int):
        model.zero_grad()
        logp, ent = lp.response_logprobs_and_entropy(model, batch, 0.8, "grad", chunk_elements)
        (logp.sum() + ent.sum()).backward()
        return logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]

    whole, chunked = run(10**9), run(1)  # one row per head chunk
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked[1], whole[1], rtol=1e-12, atol=1e-12)
    for a, b in zip(chunked[2], whole[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
