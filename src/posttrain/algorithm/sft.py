"""Supervised fine-tuning: token-level cross-entropy on the assistant tokens of each row.

The loss is a TOKEN_SUM objective, so it is exact under any micro-batch, token-budget or rank
split: each chunk reports ``(Σ -log p, weight)`` and the trainer divides once per step. The
reductions are the policy-gradient primitive's (``token_sum_loss``) with ``-log p`` as the
per-token loss: ``token_sum`` is its ``token-mean`` (every assistant token of the step weighs
the same), ``sequence_mean`` its ``seq-mean-token-mean`` (each row's mean, averaged over rows).
The loss mask is the batch's ``response_mask``: the assistant tokens the rendering marked
(``data/sft.py``). It reads none of the online objectives' knobs.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from posttrain.algorithm.knobs import SFT_KNOBS as KNOBS  # noqa: F401 (re-exported)
from posttrain.algorithm.knobs import sft_reads as reads
from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    Reduction,
)
from posttrain.algorithm.primitives.policy_gradient import token_sum_loss
from posttrain.algorithm.primitives.reads import declare_reads
from posttrain.data.logprobs import masked_response_logprobs, response_logits, token_logprobs
from posttrain.data.trajectory import TrajectoryBatch

SFTReduction = Literal["token_sum", "sequence_mean"]
_LOSS_TYPE = {"token_sum": "token-mean", "sequence_mean": "seq-mean-token-mean"}

#: ``train/sft/tokens``: assistant tokens the step trained on (summed over chunks and ranks).
SFT_METRICS = MetricAdapter({"tokens": "sft/tokens"}, reductions={"tokens": "sum"})


@declare_reads(reads)
def make_objective(rl: Any, context: Any, reduction: SFTReduction = "token_sum") -> Objective:
    """Cross-entropy on the response mask's tokens, reduced by ``reduction`` (``sft.loss_reduction``,
    bound by the entry with ``functools.partial``)."""
    if reduction not in _LOSS_TYPE:
        raise ValueError(f"reduction must be one of {sorted(_LOSS_TYPE)}, got {reduction!r}")
    loss_type = _LOSS_TYPE[reduction]

    def fn(model: nn.Module, batch: TrajectoryBatch):
        logp = masked_response_logprobs(model, batch)  # the head at trained tokens only
        mask = batch.response_mask
        loss, weight = token_sum_loss(-logp, mask, loss_type)
        return loss, {OBJECTIVE_WEIGHT_SUM: weight, "tokens": mask.sum().to(logp.dtype)}

    return Objective(fn, Reduction.TOKEN_SUM, SFT_METRICS, identity={"sft_reduction": reduction})


#: What each held-out chunk adds up; summed over chunks and ranks, then divided once.
HELD_OUT_SUMS = ("nll", "correct", "tokens")


@torch.no_grad()
def held_out_sums(model: nn.Module, part: TrajectoryBatch) -> dict[str, float]:
    """One chunk's :data:`HELD_OUT_SUMS`: the assistant tokens' summed negative log-likelihood,
    how many of them are the argmax, and how many there are."""
    logits = response_logits(model, part)
    target, mask = part.response_ids, part.response_mask
    logp = token_logprobs(logits, target)
    return {
        "nll": -float(logp[mask].double().sum()),
        "correct": float((logits.argmax(-1) == target)[mask].sum()),
        "tokens": float(mask.sum()),
    }


def held_out_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Held-out loss (mean negative log-likelihood per assistant token) and token accuracy
    (the share of assistant tokens that are the argmax) from the whole set's sums."""
    tokens = sums["tokens"]
    return {
        "val/loss": sums["nll"] / tokens,
        "val/token_accuracy": sums["correct"] / tokens,
        "val/tokens": tokens,
    }
