"""Gradient accumulation over micro-batches and data-parallel ranks, exact by construction.

``Reduction.TOKEN_SUM``: each chunk returns ``loss = numerator / weight``. We backward
``loss * weight`` (the chunk's numerator), sum the weights over chunks and ranks, all-reduce the
summed gradients and divide them once by the global weight. The gradient therefore equals that of
``sum(numerators) / sum(weights)`` over the whole step, however the rows were split.

``Reduction.MEAN``: each chunk's loss is a sample mean; it is scaled by 1/number-of-chunks and the
ranks' gradients are averaged. This equals the whole-batch gradient only when every chunk holds
the same number of samples (the documented MEAN behaviour); use TOKEN_SUM otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from posttrain.algorithm.primitives.objective import (
    CONTROL_METRICS,
    OBJECTIVE_WEIGHT_SUM,
    Objective,
    ObjectiveContractError,
    Reduction,
)
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.trainer import distributed as dp


@dataclass(frozen=True)
class Accumulation:
    """What one optimizer step's accumulation produced (gradients are left in ``.grad``).

    ``loss`` and ``weight`` are global over ranks: for TOKEN_SUM ``loss`` is
    sum(numerators)/sum(weights) and ``weight`` the global weight; for MEAN ``loss`` is the mean
    over ranks of each rank's chunk mean and ``weight`` the number of contributing ranks.
    ``metrics`` are this rank's objective metrics (raw names), combined over its chunks: weighted
    by chunk weight for TOKEN_SUM, a plain mean for MEAN. ``empty`` means a TOKEN_SUM step whose
    global weight is zero: there is nothing to learn from and the gradients are zero.
    """

    loss: float
    weight: float
    num_chunks: int
    metrics: dict[str, float] = field(default_factory=dict)
    empty: bool = False


def split_evenly(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous row ranges whose sizes differ by at most one (larger ones first)."""
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} rows into {parts} parts: need 1 <= parts <= {n}")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(slice(start, start + size))
        start += size
    return out


def row_chunks(n: int, size: int) -> list[slice]:
    """Contiguous chunks of at most ``size`` rows (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {size}")
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ObjectiveContractError(
                f"metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}"
            )
        return float(value.detach().item())
    if isinstance(value, int | float):
        return float(value)
    raise ObjectiveContractError(f"metric {name!r} must be a number, got {type(value).__name__}")


class _MetricMeans:
    """Weighted means of per-chunk metrics; a chunk only counts for the names it reports."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._weight: dict[str, float] = {}

    def add(self, metrics: Mapping[str, Any], weight: float) -> None:
        for name, value in metrics.items():
            if name in CONTROL_METRICS:
                continue
            v = _scalar(name, value)
            self._sum[name] = self._sum.get(name, 0.0) + v * weight
            self._weight[name] = self._weight.get(name, 0.0) + weight

    def result(self) -> dict[str, float]:
        return {k: (s / self._weight[k] if self._weight[k] else s) for k, s in self._sum.items()}


def _materialise_grads(params: Sequence[nn.Parameter]) -> None:
    """Every trainable parameter gets a gradient so ranks all-reduce identical tensor lists."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def accumulate_gradients(
    model: nn.Module,
    objective: Objective,
    chunks: Sequence[TrajectoryBatch],
    *,
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Accumulation:
    """Run ``objective`` on each chunk, backward, and leave the step's exact gradient in ``.grad``.

    The caller zeroes gradients first. Collectives run on every rank (also one with no chunks),
    so all ranks of a data-parallel group must call this together.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if objective.reduction is Reduction.TOKEN_SUM:
        return _token_sum(model, objective, chunks, params, forward_context)
    return _mean(model, objective, chunks, params, forward_context)


def _token_sum(model, objective, chunks, params, forward_context) -> Accumulation:
    numerator, weight = 0.0, 0.0
    means = _MetricMeans()
    for chunk in chunks:
        with forward_context():
            loss, metrics = objective(model, chunk)
        w = float(metrics[OBJECTIVE_WEIGHT_SUM])
        if w > 0:
            # A chunk with weight 0 carries no loss terms; skipping it also avoids 0 * nan.
            chunk_numerator = loss * w
            chunk_numerator.backward()
            numerator += float(chunk_numerator.detach())
            weight += w
        means.add(metrics, w)
    numerator, weight = dp.all_reduce_floats([numerator, weight])
    _materialise_grads(params)
    dp.all_reduce_grads_(params)
    if weight == 0:
        for p in params:
            p.grad.zero_()
        return Accumulation(0.0, 0.0, len(chunks), means.result(), empty=True)
    torch._foreach_div_([p.grad for p in params], weight)
    return Accumulation(numerator / weight, weight, len(chunks), means.result())


def _mean(model, objective, chunks, params, forward_context) -> Accumulation:
    total = 0.0
    means = _MetricMeans()
    n = len(chunks)
    for chunk in chunks:
        with forward_context():
            loss, metrics = objective(model, chunk)
        (loss / n).backward()
        total += float(loss.detach())
        means.add(metrics, 1.0)
    local_mean = total / n if n else 0.0
    loss_sum, contributing = dp.all_reduce_floats([local_mean, 1.0 if n else 0.0])
    _materialise_grads(params)
    dp.all_reduce_grads_(params)
    if contributing == 0:
        return Accumulation(0.0, 0.0, 0, means.result(), empty=True)
    if contributing != 1:
        torch._foreach_div_([p.grad for p in params], contributing)
    return Accumulation(loss_sum / contributing, contributing, n, means.result())
