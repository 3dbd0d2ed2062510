"""The Objective contract: the one seam between loss math and orchestration.

An objective is ``fn(model, batch) -> (loss, metrics)`` plus declarations the trainer needs to
combine chunks exactly (``reduction``), publish metrics under stable names (``metric_adapter``),
keep π_old frozen across updates (``old_logp_cache``), score a frozen reference
(``reference_scorer``) and record what defines the algorithm (``identity``).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from posttrain.data.logprobs import response_logprobs
from posttrain.data.trajectory import TrajectoryBatch

#: Metric key through which a TOKEN_SUM objective reports its chunk's normalisation weight.
OBJECTIVE_WEIGHT_SUM = "objective/weight_sum"

#: Control metrics the trainer consumes; they never need a mapping.
CONTROL_METRICS = frozenset({OBJECTIVE_WEIGHT_SUM})


class ObjectiveContractError(ValueError):
    """An objective broke the contract (missing weight, non-scalar loss, unmapped metric)."""


class Reduction(enum.Enum):
    """How the trainer combines a loss over accumulation chunks and data-parallel ranks.

    MEAN: the loss is a sample mean; the trainer scales each chunk by 1/num_chunks.
    TOKEN_SUM: the loss is ``numerator / weight``; the trainer sums numerators and weights over
    every chunk and rank, and divides once. The weight's unit (tokens, sequences) is the
    objective's choice but must match the numerator's.
    """

    MEAN = "mean"
    TOKEN_SUM = "token_sum"


@dataclass(frozen=True)
class MetricAdapter:
    """Maps algorithm-local metric names to stable public names under ``train/`` or ``val/``.

    ``mapping`` is local name -> public suffix (``"clip_frac_low" -> "pg/clip_frac_low"``).
    A name neither mapped, ignored nor a control metric raises, so renamed internals can't leak.
    """

    mapping: Mapping[str, str] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        both = set(self.mapping) & set(self.ignore)
        if both:
            raise ObjectiveContractError(f"MetricAdapter: {sorted(both)} both mapped and ignored")
        object.__setattr__(self, "ignore", frozenset(self.ignore))

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

    def extended(self, mapping: Mapping[str, str] = (), ignore=()) -> MetricAdapter:
        """A copy with more names: how a wrapper keeps its base objective's public metrics."""
        return MetricAdapter({**self.mapping, **dict(mapping)}, self.ignore | frozenset(ignore))


class LogprobScorer(Protocol):
    def __call__(self, model: nn.Module, batch: TrajectoryBatch) -> Tensor: ...


class OldLogpCache:
    """Frozen π_old for one collected batch, keyed by ``sample_ids``.

    The trainer calls :meth:`capture` once per collected batch, before the first update, under
    no-grad; every mini-batch update then reads the same frozen rows through :meth:`lookup`.
    A lookup for a sample that was never captured raises: that is the attestation that the
    ratio is taken against the policy that produced the batch, not against itself.
    """

    def __init__(self, temperature: float = 1.0, scorer: LogprobScorer | None = None) -> None:
        self.temperature = temperature
        self._scorer = scorer
        self._rows: dict[int, Tensor] = {}

    def score(self, model: nn.Module, batch: TrajectoryBatch) -> Tensor:
        if self._scorer is not None:
            return self._scorer(model, batch)
        return response_logprobs(model, batch, self.temperature)

    @torch.no_grad()
    def capture(self, model: nn.Module, batch: TrajectoryBatch, chunk_size: int = 0) -> None:
        """Score ``batch`` with the current (about to be updated) policy and freeze it."""
        self.clear()
        size = chunk_size or len(batch)
        for start in range(0, len(batch), size):
            chunk = batch[start : start + size]
            logp = self.score(model, chunk).detach()
            for sid, row in zip(chunk.sample_ids.tolist(), logp, strict=True):
                self._rows[sid] = row

    def clear(self) -> None:
        self._rows = {}

    @property
    def captured(self) -> bool:
        return bool(self._rows)

    def lookup(self, batch: TrajectoryBatch) -> Tensor:
        ids = batch.sample_ids.tolist()
        missing = [i for i in ids if i not in self._rows]
        if missing:
            raise ObjectiveContractError(
                f"π_old was not captured for sample_ids {missing[:5]}: the trainer must call "
                "old_logp_cache.capture(model, batch) before the first update of a collected batch"
            )
        rows = torch.stack([self._rows[i] for i in ids])
        if rows.shape[1] != batch.response_width:
            raise ObjectiveContractError(
                f"π_old rows have width {rows.shape[1]} but the batch has R={batch.response_width}"
            )
        return rows


class ReferenceScorer:
    """Per-token logprobs under a frozen reference network.

    The entry builds the network and hands the same module to the trainer as an auxiliary
    model, which owns its device and eval mode; the scorer only reads it.
    """

    def __init__(self, module: nn.Module, temperature: float = 1.0) -> None:
        self.module = module
        self.temperature = temperature

    @torch.no_grad()
    def __call__(self, batch: TrajectoryBatch) -> Tensor:
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
    reference_scorer: ReferenceScorer | None = None
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
