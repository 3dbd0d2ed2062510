"""The OPD objectives: hand-computed values, the step-0 identity, the conformance kit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama

from posttrain.algorithm.opd import identity_of, make_objective
from posttrain.algorithm.primitives.divergence import topk_divergence
from posttrain.algorithm.primitives.objective import OBJECTIVE_WEIGHT_SUM, ObjectiveContractError
from posttrain.config import RLConfig
from posttrain.data.logprobs import response_logits, response_logprobs
from posttrain.testing import check_objective, synthetic_batch

VOCAB = 16
CONTEXT = SimpleNamespace(max_response_length=6, teacher_top_k=VOCAB)


def _rl(**kw) -> RLConfig:
    return RLConfig(**kw)


@torch.no_grad()
def _with_teacher(batch, teacher, k=VOCAB):
    """``batch`` annotated by ``teacher`` the way the teacher role does it."""
    logits = response_logits(teacher, batch)
    logp, ids = torch.log_softmax(logits, -1).topk(k, dim=-1)
    return batch.replace(
        teacher_logprobs=response_logprobs(teacher, batch),
        teacher_topk_ids=ids,
        teacher_topk_logprobs=logp,
    )


def _batch(seed=0):
    return synthetic_batch(VOCAB, 6, seed=seed, dtype=torch.float64)


@pytest.mark.parametrize("pi_old", ["frozen", "on_policy"])
def test_advantage_mode_is_the_clipped_surrogate_with_teacher_minus_old_advantages(pi_old):
    student, teacher = tiny_llama(0, VOCAB), tiny_llama(1, VOCAB)
    batch = _with_teacher(_batch(), teacher)
    obj = make_objective(_rl(), CONTEXT)
    if pi_old == "frozen":
        obj.old_logp_cache.capture(student, batch)
    else:
        obj.old_logp_cache.follow_policy(batch)
    loss, metrics = obj(student, batch)
    loss.backward()
    got = [p.grad.clone() for p in student.parameters()]
    # On-policy (ratio 1, no clip active): loss = -mean_t A_t with A_t = teacher_t - old_t,
    # and its gradient is that of -mean_t A_t * log π(y_t).
    m = batch.response_mask
    student.zero_grad()
    logp = response_logprobs(student, batch)
    adv = (batch.teacher_logprobs - logp.detach())[m]
    assert float(loss.detach()) == pytest.approx(float(-adv.mean()), rel=1e-12)
    (-(adv * logp[m]).sum() / m.sum()).backward()
    for a, b in zip(got, (p.grad for p in student.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    assert float(metrics["reverse_kl"]) == pytest.approx(float(-adv.mean()), rel=1e-12)
    assert float(metrics[OBJECTIVE_WEIGHT_SUM]) == float(m.sum())
    assert float(metrics["clip_frac_low"]) == 0 and float(metrics["ratio_mean"]) == 1


def test_advantage_mode_weights_each_token_by_the_truncated_sampler_ratio():
    """With ``rl.rollout_is_cap`` (a lag's default 2.0) the on-policy loss is
    ``-mean_t w_t A_t`` with ``w_t = min(π_old / π_rollout, cap)``, as GRPO's clipped term."""
    student, teacher = tiny_llama(0, VOCAB), tiny_llama(1, VOCAB)
    batch = _with_teacher(_batch(), teacher)
    m = batch.response_mask
    with torch.no_grad():
        old = response_logprobs(student, batch)
    g = torch.Generator().manual_seed(3)
    rollout = old + torch.randn(old.shape, generator=g, dtype=old.dtype).mul(0.8) * m
    batch = batch.replace(rollout_logprobs=rollout)
    obj = make_objective(_rl(rollout_is_cap=2.0), CONTEXT)
    obj.old_logp_cache.follow_policy(batch)
    loss, metrics = obj(student, batch)
    w = torch.exp(old - rollout).clamp(max=2.0)[m]
    adv = (batch.teacher_logprobs - old)[m]
    assert (w == 2.0).any() and (w < 1).any()  # both sides of the cap are exercised
    assert float(loss.detach()) == pytest.approx(float(-(w * adv).mean()), rel=1e-12)
    assert float(metrics["rollout_is_weight_mean"]) == pytest.approx(float(w.mean()), rel=1e-12)
    assert float(metrics["rollout_is_weight_max"]) == 2.0
    plain = make_objective(_rl(), CONTEXT)  # cap 0: no weight
    plain.old_logp_cache.follow_policy(batch)
    plain_loss, _ = plain(student, batch)
    assert float(plain_loss.detach()) == pytest.approx(float(-adv.mean()), rel=1e-12)
    assert identity_of(_rl(rollout_is_cap=2.0))["rollout_is_cap"] == 2.0
    assert "rollout_is_cap" not in identity_of(_rl())


def test_advantage_mode_reads_pi_old_only_through_its_cache():
    batch = _with_teacher(_batch(), tiny_llama(1, VOCAB))
    obj = make_objective(_rl(), CONTEXT)
    with pytest.raises(ObjectiveContractError, match="π_old was not captured"):
        obj(tiny_llama(0, VOCAB), batch)


def test_advantage_mode_honours_epsilon_and_loss_type():
    student, teacher = tiny_llama(0, VOCAB), tiny_llama(1, VOCAB)
    batch = _with_teacher(_batch(), teacher)
    obj = make_objective(_rl(loss_type="seq-mean-token-sum", epsilon_high=0.05), CONTEXT)
    obj.old_logp_cache.capture(student, batch)
    with torch.no_grad():  # move the policy so the ratio leaves 1 and the clip acts
        for p in student.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    loss, metrics = obj(student, batch)
    m = batch.response_mask
    old = obj.old_logp_cache.old_logprobs(batch, torch.zeros(6, batch.response_width))
    ratio = (response_logprobs(student, batch) - old).exp()
    adv = torch.where(m, batch.teacher_logprobs - old, 0)
    per = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.05))
    want = torch.where(m, per, 0).sum() / m.any(-1).sum()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-10)
    assert float(metrics["clip_frac_high"]) > 0


@pytest.mark.parametrize("kind", ["reverse_kl", "forward_kl", "jsd"])
def test_direct_mode_is_the_token_mean_divergence_of_the_student_logits(kind):
    student, teacher = tiny_llama(0, VOCAB), tiny_llama(1, VOCAB)
    batch = _with_teacher(_batch(), teacher, k=5)
    obj = make_objective(_rl(distillation_mode="direct", divergence=kind, jsd_beta=0.3), CONTEXT)
    loss, metrics = obj(student, batch)
    m = batch.response_mask
    d = topk_divergence(
        response_logits(student, batch), batch.teacher_topk_ids, batch.teacher_topk_logprobs, m,
        kind, 0.3,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(float((d.sum() / m.sum()).detach()), rel=1e-12)
    assert float(metrics["divergence"]) == pytest.approx(float(loss.detach()), rel=1e-12)
    assert obj.old_logp_cache is None


def test_step_zero_with_student_equal_to_teacher_gives_zero_kl_and_zero_advantages():
    student = tiny_llama(0, VOCAB)
    batch = _with_teacher(_batch(), tiny_llama(0, VOCAB))
    adv_obj = make_objective(_rl(), CONTEXT)
    adv_obj.old_logp_cache.capture(student, batch)
    loss, metrics = adv_obj(student, batch)
    assert float(metrics["advantage_mean"]) == 0 and float(metrics["reverse_kl"]) == 0
    assert float(loss.detach()) == 0
    loss.backward()
    assert all(float(p.grad.abs().max()) == 0 for p in student.parameters())
    direct = make_objective(_rl(distillation_mode="direct"), CONTEXT)
    loss, metrics = direct(student, batch)
    assert abs(float(loss.detach())) < 1e-12 and float(metrics["reverse_kl"]) == 0


def test_identity_names_the_mode_and_only_the_knobs_it_reads():
    adv = identity_of(_rl())
    assert adv["distillation_mode"] == "advantage" and "divergence" not in adv
    assert adv["epsilon_high"] == 0.2
    direct = identity_of(_rl(distillation_mode="direct", divergence="jsd", jsd_beta=0.1), 8)
    assert direct == {
        "distillation_mode": "direct", "loss_type": "token-mean", "temperature": 1.0,
        "divergence": "jsd", "jsd_beta": 0.1, "teacher_top_k": 8,
    }  # fmt: skip
    assert "jsd_beta" not in identity_of(_rl(distillation_mode="direct"), 8)


def test_missing_teacher_signal_is_a_contract_error():
    batch = _batch()
    for mode in ("advantage", "direct"):
        obj = make_objective(_rl(distillation_mode=mode), CONTEXT)
        with pytest.raises(ObjectiveContractError, match="teacher"):
            obj(tiny_llama(0, VOCAB), batch)
    no_topk = batch.replace(teacher_logprobs=torch.zeros(6, batch.response_width))
    with pytest.raises(ObjectiveContractError, match="teacher_topk_ids"):
        make_objective(_rl(distillation_mode="direct"), CONTEXT)(tiny_llama(0, VOCAB), no_topk)


@pytest.mark.parametrize(
    "rl",
    [
        {},
        {"loss_type": "seq-mean-token-mean", "lower_bound_ratio": 3.0},
        {"distillation_mode": "direct"},
        {"distillation_mode": "direct", "divergence": "jsd", "loss_type": "seq-mean-token-sum"},
    ],
    ids=str,
)
def test_conformance_kit_passes_on_both_objectives(rl):
    batch = _with_teacher(_batch(2), tiny_llama(1, VOCAB), k=6)
    report = check_objective(make_objective(_rl(**rl), CONTEXT), tiny_llama(0, VOCAB), batch)
    assert report.max_grad_error < 1e-6
