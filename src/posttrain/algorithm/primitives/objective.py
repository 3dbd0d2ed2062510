"""The Objective contract: the one seam between loss math and orchestration.

An objective is ``fn(model, batch) -> (loss, metrics)`` plus declarations the trainer needs to
combine chunks exactly (``reduction``), publish metrics under stable names (``metric_adapter``),
keep π_old frozen across updates (``old_logp_cache``) and record what defines the algorithm
(``identity``). A frozen reference reaches the loss one way: the builder receives the network as
``context.reference_model`` and scores it inside ``fn`` (:class:`ReferenceScorer`); the placement
hands the same module to the trainer as an auxiliary model, which owns its device and eval mode.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from posttrain.algorithm.primitives._checks import ObjectiveContractError
from posttrain.algorithm.primitives.old_logp import OldLogpCache
from posttrain.data.logprobs import response_logprobs
from posttrain.data.trajectory import TrajectoryBatch

#: Metric key through which a TOKEN_SUM objective reports its chunk's normalisation weight.
OBJECTIVE_WEIGHT_SUM = "objective/weight_sum"

#: Control metrics the trainer consumes; they never need a mapping.
CONTROL_METRICS = frozenset({OBJECTIVE_WEIGHT_SUM})


class Reduction(enum.Enum):
    """How the trainer combines a loss over accumulation chunks and data-parallel ranks.

    MEAN: the loss is a sample mean; the trainer scales each chunk by 1/num_chunks.
    TOKEN_SUM: the loss is ``numerator / weight``; the trainer sums numerators and weights over
    every chunk and rank, and divides once. The weight's unit (tokens, sequences) is the
    objective's choice but must match the numerator's.
    """

    MEAN = "mean"
    TOKEN_SUM = "token_sum"


#: How a metric combines over micro-batches, optimizer steps and data-parallel ranks.
MetricReduce = Literal["mean", "sum", "max", "min", "last"]
METRIC_REDUCES: tuple[str, ...] = get_args(MetricReduce)


@dataclass(frozen=True)
class MetricAdapter:
    """Maps algorithm-local metric names to stable public names under ``train/`` or ``val/``,
    and declares how each one combines.

    ``mapping`` is local name -> public suffix (``"clip_frac_low" -> "pg/clip_frac_low"``).
    ``reductions`` is local name -> ``mean`` (the default; weighted by the chunk's objective
    weight), ``sum``, ``max``, ``min`` or ``last``; every merge (micro-batches, optimizer steps,
    ranks) reads it here, so an extreme stays a true extreme and a count stays a count.
    A name neither mapped, ignored nor a control metric raises, so renamed internals can't leak.
    """

    mapping: Mapping[str, str] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()
    reductions: Mapping[str, MetricReduce] = field(default_factory=dict)

    def __post_init__(self) -> None:
        both = set(self.mapping) & set(self.ignore)
        if both:
            raise ObjectiveContractError(f"MetricAdapter: {sorted(both)} both mapped and ignored")
        unknown = sorted(set(self.reductions) - set(self.mapping))
        if unknown:
            raise ObjectiveContractError(
                f"MetricAdapter: reductions declared for unmapped metrics {unknown}"
            )
        bad = {k: v for k, v in self.reductions.items() if v not in METRIC_REDUCES}
        if bad:
            raise ObjectiveContractError(
                f"MetricAdapter: reductions {bad} must be one of {METRIC_REDUCES}"
            )
        object.__setattr__(self, "ignore", frozenset(self.ignore))
        object.__setattr__(self, "reductions", dict(self.reductions))

    def reduction(self, name: str) -> MetricReduce:
        """How the local metric ``name`` combines (``mean`` unless declared)."""
        return self.reductions.get(name, "mean")

    def public_reductions(self, split: str = "train") -> dict[str, MetricReduce]:
        """Public name -> reduction, for merges that happen after :meth:`adapt`."""
        return {f"{split}/{pub}": self.reduction(name) for name, pub in self.mapping.items()}

    def adapt(self, metrics: Mapping[str, Any], split: str = "train") -> dict[str, Any]:
        if split not in ("train", "val"):
            raise ValueError(f"MetricAdapter.adapt: split must be 'train' or 'val', got {split!r}")
        out: dict[str, Any] = {}
        for name, value in metrics.items():
            if name in self.mapping:
                out[f"{split}/{self.mapping[name]}"] = value
            elif name in self.ignore or name in CONTROL_METRICS:
                continue
            else:
                raise ObjectiveContractError(
                    f"metric {name!r} is neither mapped nor ignored by the objective's "
                    "MetricAdapter; add it to mapping (public name) or ignore"
                )
        return out

    def extended(self, mapping: Mapping[str, str] = (), ignore=(), reductions=()) -> MetricAdapter:
        """A copy with more names: how a wrapper keeps its base objective's public metrics."""
        return MetricAdapter(
            {**self.mapping, **dict(mapping)},
            self.ignore | frozenset(ignore),
            {**self.reductions, **dict(reductions)},
        )


def combine(reduce: MetricReduce, values: Sequence[float], weights: Sequence[float]) -> float:
    """One value from several, as ``reduce`` declares (``mean`` is weighted by ``weights``).

    A mean of identical values is that value exactly (a global scalar every part reports alike
    must not drift by an ulp).
    """
    if not values:
        raise ValueError("combine: no values")
    if reduce == "sum":
        return float(sum(values))
    if reduce == "max":
        return float(max(values))
    if reduce == "min":
        return float(min(values))
    if reduce == "last":
        return float(values[-1])
    if all(v == values[0] for v in values):
        return float(values[0])
    total = float(sum(weights))
    if total == 0:
        return float(sum(values) / len(values))
    return float(sum(v * w for v, w in zip(values, weights, strict=True)) / total)


#: The batch column holding the reference's per-token log-probs when it scores on the data side.
REFERENCE_COLUMN = "reference_logprobs"


class DataSideReference:
    """Stands in for ``context.reference_model`` when the reference runs on the data side
    (``placement.reference_on``): the collected batch arrives with its log-probs in the
    :data:`REFERENCE_COLUMN` column, computed in this update's own micro-batches, and a
    :class:`ReferenceScorer` reads them there instead of running a forward."""


class ReferenceScorer:
    """Per-token logprobs under a frozen reference network.

    The entry builds the network and hands the same module to the trainer as an auxiliary
    model, which owns its device and eval mode; the scorer only reads it. Given a
    :class:`DataSideReference`, it reads the batch's :data:`REFERENCE_COLUMN` instead.
    """

    def __init__(self, module: nn.Module | DataSideReference, temperature: float = 1.0) -> None:
        self.module = module
        self.temperature = temperature

    @torch.no_grad()
    def __call__(self, batch: TrajectoryBatch) -> Tensor:
        if isinstance(self.module, DataSideReference):
            scored = batch.columns.get(REFERENCE_COLUMN)
            if scored is None:
                raise ObjectiveContractError(
                    f"the reference scores on the data side but the batch has no "
                    f"{REFERENCE_COLUMN!r} column; the reference role must annotate it before "
                    "the update (placement.reference_on)"
                )
            return scored
        device = next(self.module.parameters()).device
        return response_logprobs(self.module, batch.to(device), self.temperature).to(
            batch.input_ids.device
        )


ObjectiveFn = Callable[[nn.Module, TrajectoryBatch], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Objective:
    """A loss with everything the trainer needs to apply it exactly. Call it like ``fn``."""

    fn: ObjectiveFn
    reduction: Reduction = Reduction.MEAN
    metric_adapter: MetricAdapter = field(default_factory=MetricAdapter)
    old_logp_cache: OldLogpCache | None = None
    identity: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.reduction, Reduction):
            raise ObjectiveContractError(f"reduction must be a Reduction, got {self.reduction!r}")
        try:
            json.dumps(dict(self.identity), sort_keys=True)
        except TypeError as e:
            raise ObjectiveContractError(f"identity must be JSON-serialisable: {e}") from None

    def __call__(
        self, model: nn.Module, batch: TrajectoryBatch
    ) -> tuple[Tensor, dict[str, Tensor]]:
        loss, metrics = self.fn(model, batch)
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            raise ObjectiveContractError("objective fn must return a scalar tensor loss")
        if self.reduction is Reduction.TOKEN_SUM:
            w = metrics.get(OBJECTIVE_WEIGHT_SUM)
            if w is None:
                raise ObjectiveContractError(
                    f"a TOKEN_SUM objective must report its weight as metrics[{OBJECTIVE_WEIGHT_SUM!r}]"
                    " (loss = numerator / weight); none was returned"
                )
            wv = float(w)
            if not math.isfinite(wv) or wv < 0:
                raise ObjectiveContractError(
                    f"{OBJECTIVE_WEIGHT_SUM} must be finite and >= 0, got {wv}"
                )
        return loss, metrics
