"""Trainer behaviour around the step: π_old, metrics, non-finite steps, placement, precision."""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import VOCAB, mean_objective, pg_objective, tiny_gpt2, tiny_llama

from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    ObjectiveContractError,
    Reduction,
    ReferenceScorer,
)
from posttrain.testing import synthetic_batch
from posttrain.trainer import (
    LLMTrainer,
    NondeterministicForwardError,
    NonFiniteTrainingError,
    PiOldNotCapturedError,
)


def batch(rows=6, seed=0, offset=0, dtype=torch.float64):
    return synthetic_batch(VOCAB, rows, seed=seed, sample_id_offset=offset, dtype=dtype)


def params(model):
    return [p.detach().clone() for p in model.parameters()]


# -- π_old --------------------------------------------------------------------------------------


def test_certified_forward_first_minibatch_ratio_is_exactly_one():
    trainer = LLMTrainer(
        tiny_llama(),
        pg_objective("token-mean", use_pi_old=True),
        lr=1e-2,
        micro_batch_size=2,
        certified_deterministic_forward=True,
    )
    metrics = trainer.train_on_batch(batch(), mini_batches=3)
    assert metrics[0]["train/pg/max_abs_log_ratio"] == 0.0
    # after the first update the policy moved, so the later mini-batches see a real ratio
    assert metrics[1]["train/pg/max_abs_log_ratio"] > 0
    assert metrics[2]["train/pg/max_abs_log_ratio"] > 0


def test_pi_old_is_captured_once_before_the_first_update():
    objective = pg_objective("token-mean", use_pi_old=True)
    model = tiny_gpt2()
    b = batch()
    reference = objective.old_logp_cache.score(model, b).detach()
    trainer = LLMTrainer(model, objective, lr=1e-2, micro_batch_size=6)
    seen = []
    original = objective.old_logp_cache.old_logprobs
    objective.old_logp_cache.old_logprobs = lambda mb, cur: (
        seen.append(original(mb, cur)) or seen[-1]
    )
    trainer.train_on_batch(b, mini_batches=3)
    frozen = torch.cat(seen)  # every mini-batch read the pre-update policy, not the current one
    torch.testing.assert_close(frozen, reference, rtol=0, atol=1e-12)
    assert not objective.old_logp_cache.armed  # released after the collected batch


def _counting(seen: list[int], score, model, mb):
    seen.append(len(mb))
    return score(model, mb)


def test_one_update_per_collected_batch_follows_the_policy_without_a_scoring_forward():
    """One mini-batch: π_old is the update's own forward detached — no capture forward runs, the
    ratio is exactly 1, and the update equals the one against a separately captured π_old."""
    b = batch()
    updated = []
    for follow in (True, False):
        objective = pg_objective("token-mean", use_pi_old=True)
        trainer = LLMTrainer(tiny_gpt2(), objective, lr=1e-2, micro_batch_size=4)
        scored: list[int] = []
        original = objective.old_logp_cache.score
        objective.old_logp_cache.score = functools.partial(_counting, scored, original)
        if follow:
            (m,) = trainer.train_on_batch(b)
            assert scored == [] and m["train/pg/max_abs_log_ratio"] == 0.0
        else:
            trainer.capture_old_logp(b)
            trainer.step(b)
            assert sum(scored) == len(b)
        updated.append(params(trainer.model))
    for a, c in zip(*updated, strict=True):
        torch.testing.assert_close(a, c, rtol=0, atol=1e-12)


def test_update_without_capture_is_refused_up_front():
    trainer = LLMTrainer(
        tiny_gpt2(), pg_objective("token-mean", use_pi_old=True), lr=1e-2, micro_batch_size=2
    )
    before = params(trainer.model)
    with pytest.raises(PiOldNotCapturedError, match="capture_old_logp"):
        trainer.step(batch())
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer.model), strict=True))


def test_stale_capture_is_refused():
    trainer = LLMTrainer(
        tiny_gpt2(), pg_objective("token-mean", use_pi_old=True), lr=1e-2, micro_batch_size=2
    )
    trainer.capture_old_logp(batch(seed=0))
    trainer.step(batch(seed=0)[0:3])  # captured rows: fine
    with pytest.raises(PiOldNotCapturedError, match="stale"):
        trainer.step(batch(seed=1)[0:3])  # same sample ids, different tokens
    with pytest.raises(PiOldNotCapturedError, match=r"sample_ids \[100"):
        trainer.step(batch(seed=0, offset=100))


def test_duplicate_sample_ids_refused_at_capture():
    b = batch()
    dup = b[[0, 0, 1]]
    trainer = LLMTrainer(
        tiny_gpt2(), pg_objective("token-mean", use_pi_old=True), lr=1e-2, micro_batch_size=2
    )
    with pytest.raises(ValueError, match=r"repeats sample_ids \[0\]"):
        trainer.train_on_batch(dup)


def test_certified_forward_requires_aligned_micro_batches():
    trainer = LLMTrainer(
        tiny_gpt2(),
        pg_objective("token-mean", use_pi_old=True),
        lr=1e-2,
        micro_batch_size=2,
        certified_deterministic_forward=True,
    )
    with pytest.raises(ValueError, match=r"mini-batch size \[3, 3\]"):
        trainer.train_on_batch(batch(), mini_batches=2)


class NoisyForward(nn.Module):
    """Wraps a model and perturbs its logits randomly: a forward that is not deterministic."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = out.logits + 1e-6 * torch.randn_like(out.logits)
        return out


def test_certified_claim_is_checked():
    trainer = LLMTrainer(
        NoisyForward(tiny_gpt2()),
        pg_objective("token-mean", use_pi_old=True),
        lr=1e-2,
        micro_batch_size=2,
        certified_deterministic_forward=True,
    )
    with pytest.raises(NondeterministicForwardError, match="differing by up to"):
        trainer.train_on_batch(batch(), mini_batches=3)


# -- metrics ------------------------------------------------------------------------------------


def test_metrics_are_adapted_and_trainer_metrics_present():
    trainer = LLMTrainer(
        tiny_gpt2(), pg_objective("seq-mean-token-sum"), lr=1e-2, micro_batch_size=4
    )
    (m,) = trainer.train_on_batch(batch(rows=6))
    for key in (
        "train/loss",
        "train/grad_norm",
        "train/lr",
        "train/tokens",
        "train/optimizer_steps",
        "train/objective_weight",
        "train/pg/loss",
        "train/micro_batches",
    ):
        assert key in m, key
    assert "rows" not in m and "train/rows" not in m and OBJECTIVE_WEIGHT_SUM not in m
    assert m["train/objective_weight"] == 6 and m["train/micro_batches"] == 2
    assert m["train/pg/loss"] == pytest.approx(m["train/loss"], rel=1e-12)  # weights 4 and 2


def test_unmapped_metric_and_clashing_metric_are_errors():
    def fn(model, b):
        return model(input_ids=b.input_ids).logits.mean(), {"surprise": 1.0}

    model = tiny_gpt2()
    t = LLMTrainer(model, Objective(fn, identity={"o": 1}), lr=1e-2, micro_batch_size=8)
    with pytest.raises(ObjectiveContractError, match="'surprise' is neither mapped nor ignored"):
        t.step(batch())
    clash = Objective(fn, metric_adapter=MetricAdapter({"surprise": "loss"}))
    t = LLMTrainer(model, clash, lr=1e-2, micro_batch_size=8)
    with pytest.raises(ObjectiveContractError, match=r"trainer metric names \['train/loss'\]"):
        t.step(batch())


# -- non-finite steps ---------------------------------------------------------------------------


def poisoned_objective(bad_steps: set[int]):
    calls = {"n": 0}
    base = mean_objective()

    def fn(model, b):
        loss, metrics = base.fn(model, b)
        step = calls["n"]
        calls["n"] += 1
        return (loss * float("nan") if step in bad_steps else loss), metrics

    return Objective(fn, Reduction.MEAN, base.metric_adapter, identity={"o": "poison"})


def test_nonfinite_step_is_skipped_counted_and_named():
    trainer = LLMTrainer(tiny_gpt2(), poisoned_objective({1}), lr=1e-2, micro_batch_size=8)
    trainer.step(batch())
    before = params(trainer.model)
    opt_before = copy.deepcopy(trainer.optimizer.state_dict())
    with pytest.warns(UserWarning, match="optimizer step 2: non-finite loss"):
        m = trainer.step(batch())
    assert m["train/skipped_nonfinite"] == 1 and m["train/skipped_nonfinite_total"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer.model), strict=True))
    state = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(state[k]["exp_avg"], opt_before["state"][k]["exp_avg"]) for k in state)
    assert trainer.step(batch())["train/skipped_nonfinite"] == 0
    assert trainer.consecutive_nonfinite == 0


def test_run_stops_after_consecutive_nonfinite_steps():
    trainer = LLMTrainer(
        tiny_gpt2(),
        poisoned_objective({0, 1, 2}),
        lr=1e-2,
        micro_batch_size=8,
        max_consecutive_nonfinite=2,
    )
    with pytest.warns(UserWarning):
        trainer.step(batch())
    with pytest.warns(UserWarning), pytest.raises(NonFiniteTrainingError, match="2 consecutive"):
        trainer.step(batch())


# -- placement, precision, checkpointing --------------------------------------------------------


def test_auxiliary_models_are_placed_frozen_and_not_optimised():
    policy = tiny_gpt2()
    reference = copy.deepcopy(policy).train()
    scorer = ReferenceScorer(reference)
    trainer = LLMTrainer(
        policy,
        pg_objective("token-mean"),
        lr=1e-2,
        micro_batch_size=4,
        auxiliary_models=[reference],
    )
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    optimised = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not optimised & {id(p) for p in reference.parameters()}
    ref_before = params(reference)
    trainer.step(batch())
    assert all(torch.equal(a, b) for a, b in zip(ref_before, params(reference), strict=True))
    assert scorer(batch()).shape == (6, 6)
    with pytest.raises(ValueError, match=r"auxiliary_models\[0\] shares parameters"):
        LLMTrainer(
            policy,
            pg_objective("token-mean"),
            lr=1e-2,
            micro_batch_size=4,
            auxiliary_models=[policy],
        )


def test_bf16_autocast_trains_and_differs_from_fp32():
    b = batch(dtype=torch.float32)
    losses = {}
    for precision in ("float32", "bfloat16"):
        model = tiny_llama(dtype=torch.float32)
        t = LLMTrainer(
            model, pg_objective("token-mean"), lr=1e-2, micro_batch_size=3, precision=precision
        )
        losses[precision] = t.step(b)["train/loss"]
        assert model.lm_head.weight.dtype == torch.float32  # master weights stay full precision
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.05)
    assert losses["bfloat16"] != losses["float32"]


def test_gradient_checkpointing_same_gradient():
    b = batch()
    grads = []
    for ckpt in (False, True):
        model = tiny_llama()
        t = LLMTrainer(
            model,
            pg_objective("token-mean"),
            lr=1e-2,
            micro_batch_size=3,
            gradient_checkpointing=ckpt,
            shared_prefix="off",  # one decoder pass per micro-batch, to count recomputes
        )
        checkpointed = getattr(model, "is_activation_checkpointing", None)
        if checkpointed is None:
            checkpointed = model.is_gradient_checkpointing
        assert checkpointed is ckpt
        calls: list[int] = []
        q_proj = model.model.layers[0].self_attn.q_proj
        q_proj.register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        t.step(b)
        assert len(calls) == (4 if ckpt else 2)  # 2 micro-batches; recomputed in backward
        grads.append([p.grad.clone() for p in model.parameters()])
    for g0, g1 in zip(*grads, strict=True):
        torch.testing.assert_close(g0, g1, rtol=1e-12, atol=1e-14)


def test_gradient_checkpointing_needs_hf_model():
    with pytest.raises(ValueError, match="Scalar has neither"):

        class Scalar(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.zeros(1))

        LLMTrainer(
            Scalar(), mean_objective(), lr=1e-2, micro_batch_size=1, gradient_checkpointing=True
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"micro_batch_size": 0}, "micro_batch_size must be >= 1"),
        ({"precision": "fp16"}, "precision must be one of"),
        ({"optimizer": "lion"}, "optimizer must be one of"),
        ({"grad_clip": -1.0}, "grad_clip must be >= 0"),
        ({"lr": 0.0}, "lr must be a finite number > 0"),
        ({"max_consecutive_nonfinite": 0}, "max_consecutive_nonfinite must be >= 1"),
        ({"lr_schedule": "cosine"}, "needs total_steps > warmup_steps"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"lr": 1e-3, "micro_batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        LLMTrainer(tiny_gpt2(), mean_objective(), **args)


def test_warmup_then_cosine_schedule_and_decay_groups():
    t = LLMTrainer(
        tiny_gpt2(),
        mean_objective(),
        lr=1.0,
        micro_batch_size=8,
        weight_decay=0.1,
        lr_schedule="cosine",
        warmup_steps=2,
        total_steps=4,
    )
    lrs = [t.step(batch())["train/lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])
    decay, no_decay = t.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim < 2 for p in no_decay["params"])


def test_mean_objective_with_unequal_micro_batches_warns_once():
    t = LLMTrainer(tiny_gpt2(), mean_objective(), lr=1e-3, micro_batch_size=4)
    with pytest.warns(UserWarning, match=r"unequal micro-batches \[4, 2\]"):
        t.step(batch(rows=6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.step(batch(rows=6))


def test_more_mini_batches_than_rows_is_refused():
    t = LLMTrainer(tiny_gpt2(), mean_objective(), lr=1e-3, micro_batch_size=4)
    with pytest.raises(ValueError, match="has 2 rows .* fewer than mini_batches=3"):
        t.train_on_batch(batch(rows=2), mini_batches=3)
    with pytest.raises(ValueError, match="mini_batches must be >= 1"):
        t.train_on_batch(batch(rows=2), mini_batches=0)
