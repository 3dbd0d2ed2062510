"""DPO for language models: the sigmoid (cDPO) and IPO losses on preference pairs.

Per pair, with sequence log-probs summed over the answer's tokens (TRL's default),
``Δ = (log π(c) - log π_ref(c)) - (log π(r) - log π_ref(r))`` and the loss is
``-(1-ε) log σ(βΔ) - ε log σ(-βΔ)`` (``sigmoid``; ε: ``lmdpo.label_smoothing``) or
``(Δ - 1/(2β))²`` (``ipo``; note TRL's IPO divides each log-prob by the answer's length, this
one does not). ``lmdpo.rpo_alpha`` = α adds RPO's NLL term (Pang et al. 2024),
``α · (-log π(c) / |c|)`` per pair: the chosen answer's NLL per token, so a pair's term does not
depend on its batch-mates (TRL's ``[sigmoid, sft]`` averages the NLL over every chosen token of
its micro-batch instead; the two agree with one pair per micro-batch). It is a TOKEN_SUM
objective whose weight is the number of pairs: each chunk reports ``(Σ pair losses, pairs)`` and
the trainer divides once, so the mean over the step's pairs is exact under any micro-batch or
token-budget split that keeps each pair whole (a pair is a group; a chunk holding half a pair is
refused). The reference's per-token log-probs arrive in
the batch's ``REFERENCE_COLUMN``, scored once per step under no_grad by the entry's policy role
(the frozen base; for LoRA the policy with its adapters off).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posttrain.algorithm.knobs import LMDPO_KNOBS as KNOBS  # noqa: F401 (re-exported)
from posttrain.algorithm.knobs import lmdpo_reads as reads
from posttrain.algorithm.primitives._checks import ObjectiveContractError
from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    REFERENCE_COLUMN,
    MetricAdapter,
    Objective,
    Reduction,
)
from posttrain.algorithm.primitives.reads import declare_reads
from posttrain.data.lmdpo import CHOSEN_COLUMN
from posttrain.data.logprobs import masked_response_logprobs
from posttrain.data.trajectory import TrajectoryBatch

PreferenceLoss = Literal["sigmoid", "ipo"]

#: Local name -> public suffix: TRL's names, under ``train/`` (and ``val/`` for the held-out
#: pairs). Every one is a mean over pairs, weighted by each chunk's pairs.
NAMES = {
    "rewards_chosen": "rewards/chosen",
    "rewards_rejected": "rewards/rejected",
    "rewards_accuracies": "rewards/accuracies",
    "rewards_margins": "rewards/margins",
    "logps_chosen": "logps/chosen",
    "logps_rejected": "logps/rejected",
    "nll_loss": "nll_loss",
}
LMDPO_METRICS = MetricAdapter(NAMES, reductions=dict.fromkeys(NAMES, "mean"))


def pair_rows(batch: TrajectoryBatch) -> tuple[Tensor, Tensor]:
    """Row indices ``(chosen, rejected)`` of each pair of ``batch``, in group order; refuses a
    chunk that holds a pair's chosen without its rejected (or the reverse)."""
    chosen = batch.columns.get(CHOSEN_COLUMN)
    if chosen is None:
        raise ObjectiveContractError(f"a DPO batch needs its {CHOSEN_COLUMN!r} column")
    gid = batch.group_ids
    c = torch.nonzero(chosen).flatten()
    r = torch.nonzero(~chosen).flatten()
    c, r = c[torch.argsort(gid[c])], r[torch.argsort(gid[r])]
    if len(c) != len(r) or not torch.equal(gid[c], gid[r]) or len(torch.unique(gid)) != len(c):
        raise ObjectiveContractError(
            "a micro-batch holds half a preference pair; keep rl.shared_prefix=auto (pairs are "
            "groups, kept whole) and rl.micro_batch_tokens above a pair's tokens"
        )
    return c, r


def pair_losses(
    policy: Tensor,
    reference: Tensor,
    loss: PreferenceLoss,
    beta: float,
    smoothing: float,
    lengths: Tensor,
    rpo_alpha: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair losses and TRL's per-pair metrics from ``[P, 2]`` sequence log-probs
    (column 0 chosen, 1 rejected) of the policy and the reference, and the answers' token counts
    ``lengths`` (``[P, 2]``; the NLL term's and the ``nll_loss`` metric's normaliser)."""
    ratio = policy - reference.to(policy.dtype)
    delta = ratio[:, 0] - ratio[:, 1]
    if loss == "sigmoid":
        per_pair = -(1 - smoothing) * F.logsigmoid(beta * delta) - smoothing * F.logsigmoid(
            -beta * delta
        )
    else:
        per_pair = (delta - 1 / (2 * beta)) ** 2
    nll = -policy[:, 0] / lengths[:, 0].clamp_min(1).to(policy.dtype)
    if rpo_alpha:
        per_pair = per_pair + rpo_alpha * nll
    rewards = beta * ratio.detach()
    metrics = {
        "rewards_chosen": rewards[:, 0],
        "rewards_rejected": rewards[:, 1],
        "rewards_accuracies": (rewards[:, 0] > rewards[:, 1]).to(policy.dtype),
        "rewards_margins": rewards[:, 0] - rewards[:, 1],
        "logps_chosen": policy.detach()[:, 0],
        "logps_rejected": policy.detach()[:, 1],
        "nll_loss": nll.detach(),
    }
    return per_pair, metrics


def sequence_logps(per_token: Tensor, batch: TrajectoryBatch) -> Tensor:
    """``[P, 2]`` answer log-prob sums (chosen, rejected) of each pair."""
    c, r = pair_rows(batch)
    seq = (per_token * batch.response_mask).sum(-1)
    return torch.stack([seq[c], seq[r]], dim=1)


def answer_lengths(batch: TrajectoryBatch) -> Tensor:
    """``[P, 2]`` answer token counts (chosen, rejected) of each pair."""
    return sequence_logps(batch.response_mask.to(torch.float32), batch)


@declare_reads(reads)
def make_objective(
    rl: Any,
    context: Any,
    loss: PreferenceLoss = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    rpo_alpha: float = 0.0,
) -> Objective:
    """The preference loss (``lmdpo.loss``, ``lmdpo.beta``, ``lmdpo.label_smoothing``,
    ``lmdpo.rpo_alpha``, bound by the entry with ``functools.partial``) over the pairs of each
    chunk."""
    if loss not in ("sigmoid", "ipo"):
        raise ValueError(f"loss must be sigmoid or ipo, got {loss!r}")
    if rpo_alpha < 0:
        raise ValueError(f"rpo_alpha must be >= 0, got {rpo_alpha!r}")
    beta, smoothing, alpha = float(beta), float(label_smoothing), float(rpo_alpha)

    def fn(model: nn.Module, batch: TrajectoryBatch):
        ref = batch.columns.get(REFERENCE_COLUMN)
        if ref is None:
            raise ObjectiveContractError(
                f"a DPO batch needs the reference's log-probs in {REFERENCE_COLUMN!r}"
            )
        policy = sequence_logps(masked_response_logprobs(model, batch), batch)
        per_pair, metrics = pair_losses(policy, sequence_logps(ref, batch), loss, beta, smoothing,
                                        answer_lengths(batch), alpha)  # fmt: skip
        weight = torch.tensor(float(len(per_pair)), dtype=policy.dtype)
        means = {k: v.mean() for k, v in metrics.items()}
        return per_pair.sum() / weight, {OBJECTIVE_WEIGHT_SUM: weight, **means}

    identity = {"lmdpo_loss": loss, "beta": beta, "label_smoothing": smoothing}
    if alpha:  # absent at 0: a plain-DPO run's identity reads as it did before the knob
        identity["rpo_alpha"] = alpha
    return Objective(fn, Reduction.TOKEN_SUM, LMDPO_METRICS, identity=identity)


#: What each held-out chunk adds up (the loss, every metric, the pairs); summed over chunks and
#: ranks, then divided once by the pairs.
HELD_OUT_SUMS = ("loss", *NAMES, "pairs")


@torch.no_grad()
def held_out_sums(
    model: nn.Module,
    reference: nn.Module,
    part: TrajectoryBatch,
    *,
    loss: PreferenceLoss,
    beta: float,
    smoothing: float,
    rpo_alpha: float = 0.0,
) -> dict[str, float]:
    """One chunk of whole pairs: :data:`HELD_OUT_SUMS` under the policy and the reference."""
    policy = sequence_logps(masked_response_logprobs(model, part), part)
    ref = sequence_logps(masked_response_logprobs(reference, part), part)
    per_pair, metrics = pair_losses(policy.float(), ref.float(), loss, beta, smoothing,
                                    answer_lengths(part), rpo_alpha)  # fmt: skip
    sums = {k: float(v.double().sum()) for k, v in {"loss": per_pair, **metrics}.items()}
    return sums | {"pairs": float(len(per_pair))}


def held_out_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The loss and TRL's metrics as ``val/...`` means over every held-out pair."""
    n = sums["pairs"]
    names = {"loss": "loss", **NAMES}
    return {f"val/{names[k]}": sums[k] / n for k in names} | {"val/pairs": n}
