"""The LM DPO objective (algorithm/lmdpo.py): loss and gradient equal a hand computation of the
sigmoid (with label smoothing) and IPO losses, one step is the same whatever the micro-batch split
that keeps pairs whole, a policy equal to its reference has Δ = 0 (loss log 2), and the held-out
metrics are TRL's. (TRL's DPOTrainer is not in the suite's venv, so this hand computation is the
oracle here; tests/test_lmdpo_vs_trl.py and ``make lmdpo-vs-trl`` compare against TRL 1.16 in the
bench venv.)
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from posttrain.algorithm.lmdpo import (
    HELD_OUT_SUMS,
    held_out_metrics,
    held_out_sums,
    make_objective,
)
from posttrain.algorithm.primitives._checks import ObjectiveContractError
from posttrain.algorithm.primitives.objective import REFERENCE_COLUMN
from posttrain.data.lmdpo import collate_pairs
from posttrain.data.logprobs import response_logprobs
from posttrain.data.sft import SFTRow
from posttrain.model.tiny import tiny_config
from posttrain.trainer import LLMTrainer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config("tiny")).eval()


@pytest.fixture(scope="module")
def reference(model):
    """A frozen reference that is not the policy (its weights nudged), so Δ != 0."""
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return ref.eval().requires_grad_(False)


def pairs(seed: int = 1, n: int = 3) -> list[tuple[SFTRow, SFTRow]]:
    """Pairs sharing a prompt, answers of different lengths; only the answer carries loss."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g)
        pair = []
        for _ in range(2):
            answer = torch.randint(4, 60, (int(torch.randint(1, 7, (1,), generator=g)),),
                                   generator=g)  # fmt: skip
            ids = prompt.tolist() + answer.tolist()
            pair.append(SFTRow(ids, [False] * len(prompt) + [True] * len(answer), f"p:{i}"))
        out.append(tuple(pair))
    return out


def with_reference(batch, reference):
    with torch.no_grad():
        ref = response_logprobs(reference, batch)
    return batch.replace(columns={**batch.columns, REFERENCE_COLUMN: ref})


def seq_logp(net, row: SFTRow) -> torch.Tensor:
    """log π(answer | prompt): the row alone, full logits, log-softmax, summed over the answer."""
    logits = net(torch.tensor([row.ids])).logits[0, :-1].double()
    logp = F.log_softmax(logits, -1).gather(1, torch.tensor(row.ids[1:])[:, None])[:, 0]
    return logp[torch.tensor(row.mask[1:])].sum()


def hand_loss(
    model, reference, data, loss: str, beta: float, eps: float, rpo: float = 0.0
) -> torch.Tensor:
    """The DPO losses written out, one pair at a time:
    Δ = (log π(c) - log π_ref(c)) - (log π(r) - log π_ref(r));
    sigmoid: -(1-ε) log σ(βΔ) - ε log σ(-βΔ); ipo: (Δ - 1/(2β))²; plus RPO's
    α · (-log π(c) / |c|), |c| the chosen answer's tokens; mean over pairs."""
    out = []
    for c, r in data:
        if rpo:
            out.append(rpo * -seq_logp(model, c) / sum(c.mask[1:]))
        with torch.no_grad():
            ref_c, ref_r = seq_logp(reference, c), seq_logp(reference, r)
        delta = (seq_logp(model, c) - ref_c) - (seq_logp(model, r) - ref_r)
        if loss == "sigmoid":
            sig = lambda x: 1 / (1 + torch.exp(-x))  # noqa: E731
            out.append(
                -(1 - eps) * torch.log(sig(beta * delta)) - eps * torch.log(sig(-beta * delta))
            )
        else:
            out.append((delta - 1 / (2 * beta)) ** 2)
    return torch.stack(out).sum() / len(data)


@pytest.mark.parametrize(("loss", "beta", "eps", "rpo"),
                         [("sigmoid", 0.1, 0.0, 0.0), ("sigmoid", 0.5, 0.2, 0.0),
                          ("ipo", 0.3, 0.0, 0.0), ("sigmoid", 0.1, 0.0, 1.0),
                          ("ipo", 0.3, 0.0, 0.5)])  # fmt: skip
def test_loss_and_gradient_equal_the_hand_computation(model, reference, loss, beta, eps, rpo):
    data = pairs()
    objective = make_objective(None, None, loss=loss, beta=beta, label_smoothing=eps,
                               rpo_alpha=rpo)  # fmt: skip
    batch = with_reference(collate_pairs(data, pad_id=0), reference)
    got, metrics = objective(model, batch)
    grads = torch.autograd.grad(got, list(model.parameters()))
    expected = hand_loss(model, reference, data, loss, beta, eps, rpo)
    hand_grads = torch.autograd.grad(expected, list(model.parameters()))
    assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert metrics["objective/weight_sum"].item() == len(data)
    # float32 against the float64 hand gradients: the absolute slack scales with the largest
    # gradient (IPO's reach ~9, where float32 rounding alone is ~1e-6)
    scale = max(1.0, max(float(h.abs().max()) for h in hand_grads))
    for g, h in zip(grads, hand_grads, strict=True):
        assert torch.allclose(g, h.float(), atol=1e-6 * scale, rtol=1e-4)
    with torch.no_grad():  # TRL's metrics: β-scaled log-ratios, their order, the policy's logps
        rc = torch.stack([beta * (seq_logp(model, c) - seq_logp(reference, c)) for c, _ in data])
        rr = torch.stack([beta * (seq_logp(model, r) - seq_logp(reference, r)) for _, r in data])
        lc = torch.stack([seq_logp(model, c) for c, _ in data])
        nll = torch.stack([-seq_logp(model, c) / sum(c.mask[1:]) for c, _ in data])
    want = {"rewards_chosen": rc.mean(), "rewards_rejected": rr.mean(),
            "rewards_margins": (rc - rr).mean(), "rewards_accuracies": (rc > rr).double().mean(),
            "logps_chosen": lc.mean(), "nll_loss": nll.mean()}  # fmt: skip
    for k, v in want.items():
        assert metrics[k].item() == pytest.approx(v.item(), rel=1e-5, abs=1e-6), k


def test_a_policy_equal_to_its_reference_has_no_margin(model):
    """On-policy identity: Δ = 0, so the sigmoid loss is log 2 (any ε) and IPO's 1/(4β²)."""
    batch = with_reference(collate_pairs(pairs(seed=2), pad_id=0), model)
    for loss, eps, want in (("sigmoid", 0.0, math.log(2)), ("sigmoid", 0.3, math.log(2)),
                            ("ipo", 0.0, 1 / (4 * 0.25**2))):  # fmt: skip
        got, m = make_objective(None, None, loss=loss, beta=0.25, label_smoothing=eps)(model, batch)
        assert got.item() == pytest.approx(want, rel=1e-6)
        assert m["rewards_margins"].item() == 0 and m["rewards_accuracies"].item() == 0


def step(model, batch, **split) -> dict[str, torch.Tensor]:
    """The weights after one SGD step (lr 1: the update is the gradient) with ``split``; the
    RPO term on, so its per-pair normaliser is under the same check."""
    trained = copy.deepcopy(model).train()
    objective = make_objective(None, None, loss="sigmoid", beta=0.5, label_smoothing=0.1,
                               rpo_alpha=0.7)  # fmt: skip
    trainer = LLMTrainer(trained, objective, lr=1.0, optimizer="sgd", **split)
    trainer.train_on_batch(batch)
    return {k: v.detach().clone() for k, v in trained.named_parameters()}


def test_one_step_is_split_invariant(model, reference):
    """1 micro-batch vs k: pairs (groups) are kept whole, the loss's weight is the pairs."""
    batch = with_reference(collate_pairs(pairs(seed=3, n=4), pad_id=0), reference)
    whole = step(model, batch, micro_batch_size=8)
    for split in ({"micro_batch_size": 2}, {"micro_batch_size": 3}, {"micro_batch_size": 6},
                  {"micro_batch_size": 8, "micro_batch_tokens": 30}):  # fmt: skip
        other = step(model, batch, **split)
        for name, w in whole.items():
            assert torch.allclose(w, other[name], atol=1e-6, rtol=0), (split, name)


def test_half_a_pair_in_a_micro_batch_is_refused(model, reference):
    batch = with_reference(collate_pairs(pairs(seed=3, n=2), pad_id=0), reference)
    with pytest.raises(ObjectiveContractError, match="half a preference pair"):
        step(model, batch, micro_batch_size=1)


def held_out(model, reference, batch, pairs_per_forward: int, **knobs) -> dict[str, float]:
    """The held-out metrics as the DPO role computes them (the trainer's chunked sums)."""
    rows = 2 * pairs_per_forward
    objective = make_objective(None, None, loss="sigmoid", beta=0.1)
    trainer = LLMTrainer(model, objective, lr=1.0, micro_batch_size=rows, optimizer="sgd")
    score = functools.partial(held_out_sums, model, reference, **knobs)
    return held_out_metrics(trainer.held_out_sums(batch, rows, score, HELD_OUT_SUMS))


def test_held_out_metrics_are_the_means_over_pairs(model, reference):
    data = pairs(seed=4, n=5)
    got = held_out(model, reference, collate_pairs(data, pad_id=0), 2, loss="sigmoid",
                   beta=0.1, smoothing=0.0, rpo_alpha=0.3)  # fmt: skip
    with torch.no_grad():
        want = hand_loss(model, reference, data, "sigmoid", 0.1, 0.0, 0.3).item()
        nll = torch.stack([-seq_logp(model, c) / sum(c.mask[1:]) for c, _ in data]).mean()
    assert got["val/nll_loss"] == pytest.approx(nll.item(), rel=1e-5)
    assert got["val/loss"] == pytest.approx(want, rel=1e-5) and got["val/pairs"] == 5
    assert {"val/rewards/chosen", "val/rewards/rejected", "val/rewards/accuracies",
            "val/rewards/margins", "val/logps/chosen", "val/logps/rejected"} <= set(got)  # fmt: skip
