"""The objective conformance kit accepts contract-abiding objectives and names every violation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import (
    LOSS_TYPES,
    VOCAB,
    mean_objective,
    pg_objective,
    reduce_loss,
    tiny_gpt2,
    tiny_llama,
)

from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    OldLogpCache,
    Reduction,
)
from posttrain.data.logprobs import response_logprobs
from posttrain.testing import ConformanceError, check_objective, synthetic_batch

BATCH = synthetic_batch(VOCAB, 6, seed=2, dtype=torch.float64)
GPT2 = tiny_gpt2()


def objectives():
    yield from (pg_objective(lt, max_response_length=6) for lt in LOSS_TYPES)
    yield pg_objective("token-mean", use_pi_old=True)
    yield mean_objective()


@pytest.mark.parametrize("objective", list(objectives()), ids=lambda o: str(dict(o.identity)))
def test_contract_abiding_objectives_pass_tightly(objective):
    report = check_objective(objective, GPT2, BATCH, rtol=1e-12)
    assert report.max_grad_error < 1e-12
    assert any(c.startswith("split_gradient") for c in report.checks)
    if objective.reduction is Reduction.TOKEN_SUM:
        assert "weight_additive[k=3]" in report.checks and report.splits == (2, 3)


def test_llama_factory_passes_with_default_tolerance():
    report = check_objective(pg_objective("seq-mean-token-sum"), lambda: tiny_llama(), BATCH)
    assert report.max_grad_error < 1e-6


def test_kit_leaves_the_model_as_it_found_it():
    model = tiny_gpt2().train()
    before = [p.detach().clone() for p in model.parameters()]
    check_objective(pg_objective("token-mean", use_pi_old=True), model, BATCH)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def token_sum(fn, adapter=None, identity=None, cache=None):
    return Objective(
        fn, Reduction.TOKEN_SUM, adapter or MetricAdapter(), cache, identity=identity or {"o": "x"}
    )


def masked_logp(model, batch):
    return response_logprobs(model, batch), batch.response_mask.to(torch.float64)


def test_mean_of_means_weight_is_caught():
    """Token-mean loss but a per-response weight: the classic micro-batching bug."""

    def fn(model, batch):
        logp, m = masked_logp(model, batch)
        loss = -(logp * m * batch.advantages[:, None]).sum() / m.sum()
        return loss, {OBJECTIVE_WEIGHT_SUM: float(len(batch))}

    with pytest.raises(ConformanceError) as e:
        check_objective(token_sum(fn), GPT2, BATCH)
    text = str(e.value)
    assert "numerator_additive[k=2]" in text and "split_gradient[k=2]" in text
    assert "mean-of-means" in text


def test_non_additive_weight_is_caught():
    def fn(model, batch):
        logp, m = masked_logp(model, batch)
        num, weight = reduce_loss(
            -logp * batch.advantages[:, None], batch.response_mask, "token-mean"
        )
        return num / weight, {OBJECTIVE_WEIGHT_SUM: weight / len(batch)}  # mean length: not a count

    with pytest.raises(ConformanceError, match=r"weight_additive\[k=2\].*must count units"):
        check_objective(token_sum(fn), GPT2, BATCH)


def test_mean_objective_that_is_a_token_mean_is_caught():
    def fn(model, batch):
        logp, m = masked_logp(model, batch)
        return -(logp * m).sum() / m.sum(), {}

    with pytest.raises(ConformanceError, match="must be a per-sample mean"):
        check_objective(Objective(fn, identity={"o": "tm"}), GPT2, BATCH)


def test_several_violations_are_listed_together():
    base = pg_objective("token-mean")
    bad = Objective(
        base.fn, Reduction.TOKEN_SUM, MetricAdapter({"pg_loss": "pg/loss"}), identity={}
    )
    with pytest.raises(ConformanceError) as e:
        check_objective(bad, GPT2, BATCH)
    assert any(f.startswith("identity:") for f in e.value.failures)
    assert any("'rows' is neither mapped nor ignored" in f for f in e.value.failures)


def test_cache_declared_but_never_read_is_caught():
    base = pg_objective("token-mean")
    lazy = token_sum(base.fn, base.metric_adapter, {"o": "lazy"}, OldLogpCache())
    with pytest.raises(ConformanceError, match="declares old_logp_cache but ran without"):
        check_objective(lazy, GPT2, BATCH)


@pytest.mark.parametrize(
    ("make_loss", "match"),
    [
        (lambda loss: loss * float("inf"), "finite_loss"),
        (lambda loss: loss.detach(), "not on the model graph"),
    ],
)
def test_broken_losses_are_caught(make_loss, match):
    base = pg_objective("token-mean")

    def fn(model, batch):
        loss, metrics = base.fn(model, batch)
        return make_loss(loss), metrics

    with pytest.raises(ConformanceError, match=match):
        check_objective(token_sum(fn, base.metric_adapter), GPT2, BATCH)


def test_mean_objective_needs_a_divisible_batch():
    with pytest.raises(ValueError, match="k dividing rows for MEAN"):
        check_objective(mean_objective(), GPT2, BATCH[0:5], splits=(2, 3))
