"""The SFT objective (algorithm/sft.py): loss and gradient equal a hand computation, and one
optimizer step is the same whatever the micro-batch split (rows or token budget), with rows that
share a prefix (encoded once: the batch's prompt) or not; the head runs at trained tokens only."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from posttrain.algorithm.sft import (
    HELD_OUT_SUMS,
    held_out_metrics,
    held_out_sums,
    make_objective,
)
from posttrain.data.logprobs import masked_response_logprobs, response_logits, response_logprobs
from posttrain.data.sft import SFTRow, collate, collate_packed, common_prefix, pack
from posttrain.model.tiny import tiny_config
from posttrain.trainer import LLMTrainer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config("tiny")).eval()


def rows(seed: int = 1, n: int = 5, vocab: int = 60, prefix: int = 0) -> list[SFTRow]:
    """Rows of varied lengths with scattered loss tokens (never the first, as rendering makes);
    ``prefix``: the first ``prefix`` tokens the same untrained ones in every row (a system
    prompt)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(4, min(vocab, 60), (prefix,), generator=g).tolist()
    out = []
    for i in range(n):
        length = int(torch.randint(4, 12, (1,), generator=g))
        ids = shared + torch.randint(4, min(vocab, 60), (length,), generator=g).tolist()
        mask = [False] * (prefix + 1) + (torch.rand(length - 1, generator=g) < 0.6).tolist()
        mask[-1] = True  # every row trains at least one token
        out.append(SFTRow(ids, mask, f"rows:{i}"))
    return out


def hand_loss(model, data: list[SFTRow], reduction: str) -> torch.Tensor:
    """Cross-entropy written out: each row alone, full logits, log-softmax, masked mean."""
    per_row, counts = [], []
    for r in data:
        logits = model(torch.tensor([r.ids])).logits[0, :-1]
        nll = -F.log_softmax(logits.double(), -1).gather(1, torch.tensor(r.ids[1:])[:, None])
        m = torch.tensor(r.mask[1:])
        per_row.append(nll[:, 0][m].sum())
        counts.append(int(m.sum()))
    if reduction == "token_sum":
        return torch.stack(per_row).sum() / sum(counts)
    return torch.stack([s / c for s, c in zip(per_row, counts, strict=True)]).mean()


@pytest.mark.parametrize("prefix", [0, 6])
@pytest.mark.parametrize("reduction", ["token_sum", "sequence_mean"])
def test_loss_and_gradient_equal_the_hand_computation(model, reduction, prefix):
    data = rows(prefix=prefix)
    assert collate(data, pad_id=0).prompt_width == (6 if prefix else 1)
    objective = make_objective(None, None, reduction=reduction)
    loss, metrics = objective(model, collate(data, pad_id=0))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected = hand_loss(model, data, reduction)
    hand_grads = torch.autograd.grad(expected, list(model.parameters()))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    weight = metrics["objective/weight_sum"].item()
    assert weight == (sum(sum(r.mask) for r in data) if reduction == "token_sum" else len(data))
    for g, h in zip(grads, hand_grads, strict=True):
        assert torch.allclose(g, h.float(), atol=1e-6, rtol=1e-5)


def step(model, data, **split) -> dict[str, torch.Tensor]:
    """The weights after one SGD step (lr 1: the update is the gradient) with ``split``."""
    trained = copy.deepcopy(model).train()
    objective = make_objective(None, None, reduction=split.pop("reduction", "token_sum"))
    trainer = LLMTrainer(trained, objective, lr=1.0, optimizer="sgd", **split)
    trainer.train_on_batch(collate(data, pad_id=0))
    return {k: v.detach().clone() for k, v in trained.named_parameters()}


@pytest.mark.parametrize("prefix", [0, 6])
@pytest.mark.parametrize("reduction", ["token_sum", "sequence_mean"])
def test_one_step_is_split_invariant(model, reduction, prefix):
    data = rows(seed=2, n=6, prefix=prefix)
    whole = step(model, data, micro_batch_size=6, reduction=reduction)
    for split in ({"micro_batch_size": 1}, {"micro_batch_size": 4},
                  {"micro_batch_size": 6, "micro_batch_tokens": 20}):  # fmt: skip
        other = step(model, data, reduction=reduction, **split)
        for name, w in whole.items():
            assert torch.allclose(w, other[name], atol=1e-6, rtol=0), (split, name)


def test_the_common_prefix_stops_before_any_trained_token_and_any_difference():
    a = SFTRow([1, 2, 3, 4, 5, 6], [False, False, False, False, True, True], "a")
    b = SFTRow([1, 2, 3, 4, 9, 9], [False, False, False, False, False, True], "b")
    assert common_prefix([a, b]) == 4  # differ at token 4, a trains it
    c = SFTRow([1, 2, 3, 4, 5, 6], [False, False, True, True, True, True], "c")
    assert common_prefix([a, c]) == 2  # c trains token 2: it must be a response token
    d = SFTRow([7, 2, 3], [False, True, True], "d")
    assert common_prefix([a, d]) == 1  # nothing shared: the first token alone
    batch = collate([a, b], pad_id=0)
    assert batch.prompt_width == 4 and batch.response_mask.tolist() == [[True, True],
                                                                        [False, True]]  # fmt: skip


@pytest.mark.parametrize("chunk_elements", [1 << 26, 60 * 7])
def test_masked_logprobs_equal_the_full_ones_at_the_mask(model, chunk_elements):
    """The head at trained tokens only (whole or in chunks of 7 positions): the same values
    and gradient as every position scored and the rest masked out."""
    batch = collate(rows(seed=6, n=5, prefix=3), pad_id=0)
    params = list(model.parameters())
    got = masked_response_logprobs(model, batch, chunk_elements=chunk_elements)
    full = response_logprobs(model, batch).masked_fill(~batch.response_mask, 0.0)
    assert torch.equal(got == 0, ~batch.response_mask | (full == 0))
    assert torch.allclose(got, full, atol=1e-6, rtol=0)
    weights = torch.rand(got.shape, generator=torch.Generator().manual_seed(0))
    g_got = torch.autograd.grad((got * weights).sum(), params)
    g_full = torch.autograd.grad((full * weights).sum(), params)
    for a, b in zip(g_got, g_full, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def held_out(model, batch, rows: int) -> dict[str, float]:
    """The held-out metrics as the SFT role computes them (the trainer's chunked sums)."""
    trainer = LLMTrainer(model, make_objective(None, None), lr=1.0, micro_batch_size=rows,
                         optimizer="sgd")  # fmt: skip
    score = functools.partial(held_out_sums, model)
    return held_out_metrics(trainer.held_out_sums(batch, rows, score, HELD_OUT_SUMS))


def test_held_out_loss_and_token_accuracy(model):
    data = rows(seed=3, n=4)
    metrics = held_out(model, collate(data, pad_id=0), rows=3)
    assert metrics["val/loss"] == pytest.approx(hand_loss(model, data, "token_sum").item(), 1e-6)
    correct = total = 0
    for r in data:
        logits = model(torch.tensor([r.ids])).logits[0, :-1]
        m = torch.tensor(r.mask[1:])
        correct += int((logits.argmax(-1) == torch.tensor(r.ids[1:]))[m].sum())
        total += int(m.sum())
    assert metrics["val/token_accuracy"] == correct / total and metrics["val/tokens"] == total


@pytest.fixture(scope="module", params=["tiny", "arith_tools"])
def any_model(request):
    """A Llama, and a Mistral whose layers attend to a sliding window (``arith_tools``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(request.param)).eval()


def test_a_packed_rows_logits_per_document_equal_the_unpacked_rows(any_model):
    """No cross-contamination: each document of a packed row sees only itself."""
    data = rows(seed=4, n=5, vocab=any_model.config.vocab_size)
    bins = pack(data, max_tokens=24)
    assert any(len(b) > 1 for b in bins)  # something was packed
    packed = response_logits(any_model, collate_packed(data, bins, pad_id=0))
    alone = response_logits(any_model, collate(data, pad_id=0))
    for b, members in enumerate(bins):
        at = 0
        for i in members:  # packed column c predicts packed token c + 1
            n = len(data[i].ids)
            assert torch.allclose(packed[b, at : at + n - 1], alone[i, : n - 1], atol=1e-5)
            at += n


def test_a_packed_step_equals_the_unpacked_step(model):
    data = rows(seed=5, n=6)
    whole = step(model, data, micro_batch_size=6)
    packed = copy.deepcopy(model).train()
    trainer = LLMTrainer(packed, make_objective(None, None), lr=1.0, optimizer="sgd",
                         micro_batch_size=2)  # fmt: skip
    trainer.train_on_batch(collate_packed(data, pack(data, max_tokens=24), pad_id=0))
    for name, w in packed.named_parameters():
        assert torch.allclose(w, whole[name], atol=1e-6, rtol=0), name


def test_packing_is_first_fit_longest_first_within_the_budget():
    data = rows(seed=6, n=8)
    bins = pack(data, max_tokens=20)
    assert sorted(i for b in bins for i in b) == list(range(8))
    assert all(sum(len(data[i].ids) for i in b) <= 20 for b in bins)
    assert bins == pack(data, max_tokens=20)


def test_packing_keeps_a_sequence_for_every_rank():
    """``min_bins``: the fullest bin gives its last row a bin of its own until there are enough
    (one sequence per policy rank); every row still packed once, within the budget."""
    data = rows(seed=6, n=8)
    one = pack(data, max_tokens=1000)
    assert len(one) == 1
    for ranks in (2, 3, 8):
        bins = pack(data, max_tokens=1000, min_bins=ranks)
        assert len(bins) == ranks and sorted(i for b in bins for i in b) == list(range(8))
        assert bins[0] == one[0][: len(bins[0])]  # rows leave the fullest bin from its end
    assert pack(data, max_tokens=20, min_bins=2) == pack(data, max_tokens=20)  # enough already
    with pytest.raises(ValueError, match="cannot pack 8 rows into at least 9 sequences"):
        pack(data, max_tokens=1000, min_bins=9)
