"""Split invariance: an optimizer step's gradient does not depend on how its rows are chunked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import LOSS_TYPES, VOCAB, mean_objective, pg_objective, reduce_loss, tiny_gpt2

from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    Reduction,
)
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.testing import synthetic_batch
from posttrain.trainer import LLMTrainer, accumulate_gradients, row_chunks, split_evenly

# -- a one-parameter model whose gradients can be computed by hand -------------------------------


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))


def linear_objective(loss_type: str, max_len: int = 4) -> Objective:
    """Per-token loss theta * advantage_i, reduced per loss type."""

    def fn(model, batch):
        per_token = model.theta * batch.advantages[:, None].expand(-1, batch.response_width)
        num, weight = reduce_loss(per_token, batch.response_mask, loss_type, max_len)
        return num / max(weight, 1.0), {OBJECTIVE_WEIGHT_SUM: weight}

    return Objective(fn, Reduction.TOKEN_SUM, MetricAdapter(), identity={"t": loss_type})


def hand_batch(lengths, advantages, r: int = 4) -> TrajectoryBatch:
    b = len(lengths)
    mask = torch.arange(r)[None, :] < torch.tensor(lengths)[:, None]
    attn = torch.cat([torch.ones(b, 1, dtype=torch.long), mask.long()], dim=1)
    return TrajectoryBatch(
        input_ids=torch.ones(b, 1 + r, dtype=torch.long),
        attention_mask=attn,
        response_mask=mask,
        group_ids=torch.zeros(b, dtype=torch.long),
        sample_ids=torch.arange(b),
        advantages=torch.tensor(advantages, dtype=torch.float64),
    )


# lengths 1, 3, 2, 0 and advantages 1, -2, 4, 5: token sums a_i * L_i = 1, -6, 8, 0 (sum 3).
HAND = {
    "token-mean": 3 / 6,  # mean-of-means over single rows would give (1 - 2 + 4) / 3 = 1
    "seq-mean-token-mean": (1 - 2 + 4 + 0) / 4,
    "seq-mean-token-sum": 3 / 4,
    "seq-mean-token-sum-fixed": 3 / 4 / 4,
}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("micro", [1, 2, 3, 4])
def test_hand_computed_gradient_any_split(loss_type, micro):
    model = Scalar()
    trainer = LLMTrainer(
        model, linear_objective(loss_type), lr=1.0, optimizer="sgd", micro_batch_size=micro
    )
    metrics = trainer.step(hand_batch([1, 3, 2, 0], [1.0, -2.0, 4.0, 5.0]))
    assert metrics["train/loss"] == pytest.approx(HAND[loss_type], rel=1e-15)  # theta = 1
    assert model.theta.grad.item() == pytest.approx(HAND[loss_type], rel=1e-15)
    assert model.theta.item() == pytest.approx(1.0 - HAND[loss_type], rel=1e-15)
    assert metrics["train/micro_batches"] == len(row_chunks(4, micro))


def test_mean_of_means_would_differ():
    """The hand value is not what per-chunk normalisation would give: the test can fail."""
    chunks = [hand_batch([n], [a]) for n, a in [(1, 1.0), (3, -2.0), (2, 4.0)]]
    per_chunk_means = [a for a in (1.0, -2.0, 4.0)]
    assert sum(per_chunk_means) / 3 != pytest.approx(HAND["token-mean"])
    model = Scalar()
    acc = accumulate_gradients(model, linear_objective("token-mean"), chunks)
    assert acc.weight == 6 and model.theta.grad.item() == pytest.approx(0.5, rel=1e-15)


def test_zero_weight_everywhere_skips_the_update():
    model = Scalar()
    trainer = LLMTrainer(model, linear_objective("token-mean"), lr=1.0, micro_batch_size=1)
    with pytest.warns(UserWarning, match="weight is 0"):
        metrics = trainer.step(hand_batch([0, 0], [1.0, 2.0]))
    assert metrics["train/skipped_empty"] == 1 and model.theta.item() == 1.0
    assert trainer.global_step == 1 and trainer.skipped_empty_total == 1


# -- real tiny transformer, float64 ------------------------------------------------------------

MODEL = tiny_gpt2()


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def whole_batch_grads(model, objective, batch):
    model.zero_grad(set_to_none=True)
    loss, _ = objective(model, batch)
    loss.backward()
    g = grads_of(model)
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), g


def assert_grads_close(a, b, rel=1e-12):
    for name in a:
        err = (a[name] - b[name]).norm() / b[name].norm().clamp(min=1e-300)
        assert err < rel, f"{name}: relative error {err:.3e}"


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_split_matches_whole_batch(loss_type):
    objective = pg_objective(loss_type, max_response_length=6)
    batch = synthetic_batch(VOCAB, 7, seed=3, dtype=torch.float64)
    loss, whole = whole_batch_grads(MODEL, objective, batch)
    for micro in (1, 2, 3, 7):
        MODEL.zero_grad(set_to_none=True)
        chunks = [batch[s] for s in row_chunks(len(batch), micro)]
        acc = accumulate_gradients(MODEL, objective, chunks)
        assert acc.loss == pytest.approx(loss, rel=1e-12)
        assert_grads_close(grads_of(MODEL), whole)


def test_mean_reduction_equal_chunks_match_whole_batch():
    objective = mean_objective()
    batch = synthetic_batch(VOCAB, 6, seed=4, dtype=torch.float64)
    loss, whole = whole_batch_grads(MODEL, objective, batch)
    for parts in (2, 3, 6):
        MODEL.zero_grad(set_to_none=True)
        acc = accumulate_gradients(MODEL, objective, [batch[s] for s in split_evenly(6, parts)])
        assert acc.loss == pytest.approx(loss, rel=1e-12)
        assert_grads_close(grads_of(MODEL), whole)


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rows=st.integers(2, 7),
    micro=st.integers(1, 7),
    loss_type=st.sampled_from(LOSS_TYPES),
)
def test_split_invariance_property(seed, rows, micro, loss_type):
    objective = pg_objective(loss_type, max_response_length=6)
    batch = synthetic_batch(VOCAB, rows, seed=seed, dtype=torch.float64)
    loss, whole = whole_batch_grads(MODEL, objective, batch)
    MODEL.zero_grad(set_to_none=True)
    acc = accumulate_gradients(MODEL, objective, [batch[s] for s in row_chunks(rows, micro)])
    assert acc.loss == pytest.approx(loss, rel=1e-12)
    assert_grads_close(grads_of(MODEL), whole)


def test_trainer_step_is_split_invariant_including_clip_and_adamw():
    """Whole optimizer steps (AdamW, clipping) agree for different micro-batch sizes."""
    batch = synthetic_batch(VOCAB, 6, seed=5, dtype=torch.float64)
    results = []
    for micro in (1, 4, 6):
        model = tiny_gpt2()
        trainer = LLMTrainer(
            model,
            pg_objective("seq-mean-token-mean"),
            lr=1e-3,
            micro_batch_size=micro,
            grad_clip=0.05,
            weight_decay=0.1,
        )
        metrics = trainer.train_on_batch(batch, mini_batches=2)
        results.append((model, [m["train/loss"] for m in metrics], metrics[0]["train/grad_norm"]))
    (ref, ref_losses, ref_norm), *others = results
    assert ref_norm > 0.05  # clipping was active
    for model, losses, _ in others:
        assert losses == pytest.approx(ref_losses, rel=1e-12)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_split_helpers():
    assert split_evenly(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert row_chunks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    with pytest.raises(ValueError, match="cannot split 2 rows into 3"):
        split_evenly(2, 3)
    with pytest.raises(ValueError, match="micro_batch_size"):
        row_chunks(3, 0)
