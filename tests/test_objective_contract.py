"""The Objective contract, the GRPO objective builder and the batch contract."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import random_batch, tiny_llama

from posttrain.algorithm.grpo import identity_of, make_objective
from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    ObjectiveContractError,
    Reduction,
)
from posttrain.algorithm.primitives.policy_gradient import LOSS_TYPES
from posttrain.data.logprobs import response_logprobs
from posttrain.data.trajectory import TrajectoryBatch


def rl(**kw):
    base = dict(
        grpo_surrogate="clipped",
        importance_sampling_level="token",
        epsilon_low=0.2,
        epsilon_high=0.28,
        lower_bound_ratio=0.0,
        temperature=1.0,
        loss_type="token-mean",
        kl_beta=0.0,
        entropy_coef=0.0,
        kl_estimator="k3",
        rollout_is_cap=0.0,
    )
    base.update(kw)
    return SimpleNamespace(**base)


CTX = SimpleNamespace(max_response_length=5)


def test_token_sum_without_weight_fails_on_first_call(model):
    obj = Objective(lambda m, b: (torch.zeros(()), {}), Reduction.TOKEN_SUM)
    with pytest.raises(ObjectiveContractError, match=OBJECTIVE_WEIGHT_SUM):
        obj(model, random_batch())


def test_non_scalar_loss_and_unserialisable_identity_fail(model):
    with pytest.raises(ObjectiveContractError, match="scalar"):
        Objective(lambda m, b: (torch.zeros(2), {}))(model, random_batch())
    with pytest.raises(ObjectiveContractError, match="JSON"):
        Objective(lambda m, b: (torch.zeros(()), {}), identity={"x": object()})


def test_metric_adapter_maps_ignores_and_refuses_unmapped():
    a = MetricAdapter({"clip": "pg/clip"}, ignore={"debug"})
    out = a.adapt({"clip": 1.0, "debug": 2.0, OBJECTIVE_WEIGHT_SUM: 3.0}, "val")
    assert out == {"val/pg/clip": 1.0}
    with pytest.raises(ObjectiveContractError, match="'surprise'"):
        a.adapt({"surprise": 1.0})
    assert a.extended({"surprise": "x/s"}).adapt({"surprise": 1.0}) == {"train/x/s": 1.0}


def test_identity_has_sequence_key_only_at_sequence_level():
    tok = identity_of(rl())
    assert "importance_sampling_level" not in tok
    assert identity_of(rl(importance_sampling_level="sequence"))["importance_sampling_level"] == (
        "sequence"
    )
    assert set(tok) == {
        "grpo_surrogate", "loss_type", "epsilon_low", "epsilon_high",
        "lower_bound_ratio", "temperature", "kl_beta",
    }  # fmt: skip
    json.dumps(tok)


def test_clipped_refuses_update_without_captured_pi_old(model):
    obj = make_objective(rl(), CTX)
    with pytest.raises(ObjectiveContractError, match="π_old was not captured"):
        obj(model, random_batch())


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimator_selects_the_anchor(estimator):
    """The KL term is kl_beta times the chosen estimator on d = log ref - log policy."""
    policy, ref, batch = tiny_llama(0), tiny_llama(1), random_batch()
    ctx = SimpleNamespace(max_response_length=5, reference_model=ref)
    obj = make_objective(rl(kl_beta=0.5, kl_estimator=estimator), ctx)
    assert obj.identity["kl_estimator"] == estimator
    obj.old_logp_cache.capture(policy, batch)
    _, metrics = obj(policy, batch)
    m = batch.response_mask
    with torch.no_grad():
        d = (response_logprobs(ref, batch) - response_logprobs(policy, batch))[m]
    expected = {"k1": -d, "k2": d * d / 2, "k3": torch.exp(d) - 1 - d}[estimator]
    assert metrics["kl_ref"].item() == pytest.approx(expected.mean().item(), rel=1e-10)


def test_missing_advantages_fail_loudly(model):
    obj = make_objective(rl(grpo_surrogate="legacy_pg"), CTX)
    with pytest.raises(ObjectiveContractError, match="advantages"):
        obj(model, random_batch().replace(advantages=None))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clipped_objective_on_policy_and_split_exact(model, loss_type, level):
    obj = make_objective(rl(loss_type=loss_type, importance_sampling_level=level), CTX)
    batch = random_batch(b=6)
    obj.old_logp_cache.capture(model, batch)
    loss, metrics = obj(model, batch)
    assert metrics["ratio_min"].item() == 1.0 and metrics["ratio_max"].item() == 1.0
    (loss * metrics[OBJECTIVE_WEIGHT_SUM]).backward()
    whole = [p.grad.clone() / metrics[OBJECTIVE_WEIGHT_SUM] for p in model.parameters()]
    model.zero_grad()
    weight = 0.0
    for idx in ([0, 3], [1, 2, 4, 5]):
        lk, mk = obj(model, batch[idx])
        (lk * mk[OBJECTIVE_WEIGHT_SUM]).backward()
        weight += mk[OBJECTIVE_WEIGHT_SUM].item()
    assert weight == metrics[OBJECTIVE_WEIGHT_SUM].item()
    for g_whole, p in zip(whole, model.parameters(), strict=True):
        assert torch.allclose(p.grad / weight, g_whole, atol=1e-14, rtol=1e-12)
    json.dumps(obj.identity)
    assert set(obj.metric_adapter.adapt(metrics)) >= {"train/pg/loss", "train/pg/ratio_mean"}


def test_kl_anchor_uses_reference_and_is_zero_against_itself():
    policy = tiny_llama(0)
    ref = tiny_llama(0)
    obj = make_objective(
        rl(kl_beta=0.5), SimpleNamespace(max_response_length=5, reference_model=ref)
    )
    batch = random_batch()
    obj.old_logp_cache.capture(policy, batch)
    _, metrics = obj(policy, batch)
    assert metrics["kl_ref"].item() == pytest.approx(0.0, abs=1e-14)
    other = make_objective(
        rl(kl_beta=0.5), SimpleNamespace(max_response_length=5, reference_model=tiny_llama(1))
    )
    other.old_logp_cache.capture(policy, batch)
    _, m2 = other(policy, batch)
    assert m2["kl_ref"].item() > 0
    with pytest.raises(ValueError, match="reference_model"):
        make_objective(rl(kl_beta=0.1), CTX)


def test_fixed_loss_type_validates_context_bound():
    for bad in (None, 0, True, 2.5):
        with pytest.raises(ValueError, match="max_response_length"):
            make_objective(
                rl(loss_type="seq-mean-token-sum-fixed"), SimpleNamespace(max_response_length=bad)
            )


def test_response_logprobs_ignores_left_padding():
    model = tiny_llama()
    batch = random_batch(b=4, p=4)
    full = response_logprobs(model, batch)
    for i in range(len(batch)):
        keep = batch.attention_mask[i].bool()
        keep[batch.prompt_width :] = True  # response region kept whole (right padding)
        row = TrajectoryBatch(
            input_ids=batch.input_ids[i : i + 1, keep],
            attention_mask=batch.attention_mask[i : i + 1, keep],
            response_mask=batch.response_mask[i : i + 1],
            group_ids=batch.group_ids[i : i + 1],
            sample_ids=batch.sample_ids[i : i + 1],
        )
        lp = response_logprobs(model, row)
        m = batch.response_mask[i]
        assert torch.allclose(lp[0][m], full[i][m], atol=1e-12)


def test_trajectory_batch_validation_names_field():
    b = random_batch()
    with pytest.raises(ValueError, match="TrajectoryBatch.response_mask"):
        b.replace(response_mask=b.response_mask.long())
    with pytest.raises(ValueError, match="TrajectoryBatch.advantages"):
        b.replace(advantages=torch.zeros(len(b) + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="TrajectoryBatch.teacher_logprobs"):
        b.replace(teacher_logprobs=torch.zeros(len(b), b.response_width + 1))
    sub = b[[4, 1]]
    assert sub.sample_ids.tolist() == [4, 1]
    assert torch.equal(sub.advantages, b.advantages[[4, 1]])
