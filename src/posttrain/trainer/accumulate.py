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
    MetricReduce,
    Objective,
    ObjectiveContractError,
    Reduction,
    combine,
)
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.trainer import distributed as dp


@dataclass(frozen=True)
class Accumulation:
    """What one optimizer step's accumulation produced (gradients are left in ``.grad``).

    ``loss`` and ``weight`` are global over ranks: for TOKEN_SUM ``loss`` is
    sum(numerators)/sum(weights) and ``weight`` the global weight; for MEAN ``loss`` is the mean
    over ranks of each rank's chunk mean and ``weight`` the number of contributing ranks.
    ``metrics`` are the objective's metrics (raw names), combined over chunks and ranks as the
    metric adapter declares (``mean`` weighted by chunk weight for TOKEN_SUM, plain for MEAN).
    ``empty`` means a TOKEN_SUM step whose global weight is zero: there is nothing to learn from
    and the gradients are zero.
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


def group_order(group_ids: Sequence[int]) -> list[int]:
    """Row indices with each group's rows together: groups in order of their first row, rows
    in their own order (the identity for a batch whose groups are already contiguous)."""
    rank: dict[int, int] = {}
    for g in group_ids:
        rank.setdefault(g, len(rank))
    return sorted(range(len(group_ids)), key=lambda i: rank[group_ids[i]])


def group_chunks(group_ids: Sequence[int], size: int) -> list[slice]:
    """Contiguous chunks of at most ``size`` rows that cut no run of equal group ids, where they
    can: runs are packed greedily in order, and a run longer than ``size`` gets chunks of its own.

    A shared-prefix forward encodes each prompt once per chunk, so a group kept whole is encoded
    once. The row order is unchanged; only a TOKEN_SUM objective is exact under any such cut.
    """
    if size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {size}")
    runs, start = [], 0
    for i in range(1, len(group_ids) + 1):
        if i == len(group_ids) or group_ids[i] != group_ids[start]:
            runs.append((start, i))
            start = i
    out: list[slice] = []
    lo = hi = 0
    for a, b in runs:
        if b - a > size:
            if hi > lo:
                out.append(slice(lo, hi))
            out += [slice(s, min(s + size, b)) for s in range(a, b, size)]
            lo = hi = b
        elif b - lo > size:
            out.append(slice(lo, hi))
            lo, hi = a, b
        else:
            hi = b
    if hi > lo:
        out.append(slice(lo, hi))
    return out


def token_chunks(
    prompt: Sequence[int],
    response: Sequence[int],
    budget: int,
    group_ids: Sequence[int] | None = None,
) -> list[list[int]]:
    """Row indices of micro-batches of at most ``budget`` forwarded tokens, longest rows first.

    A micro-batch's tokens are its rows x (longest prompt + longest response), the columns its
    trimmed forward runs on (``data/padding.py``). Rows are sorted by length, so neighbours pad
    little, and packed greedily. With ``group_ids`` the units are whole groups (a shared-prefix
    forward encodes each prompt once per micro-batch); a group over the budget is split into row
    micro-batches of its own. A single row over the budget runs alone. Only a TOKEN_SUM
    objective is exact under this regrouping.
    """
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {budget}")
    n = len(prompt)
    if len(response) != n or (group_ids is not None and len(group_ids) != n):
        raise ValueError("prompt, response and group_ids need one entry per row")
    length = [prompt[i] + response[i] for i in range(n)]
    by_length = sorted(range(n), key=lambda i: (-length[i], i))
    if group_ids is None:
        units = [[i] for i in by_length]
    else:
        groups: dict[int, list[int]] = {}
        for i in by_length:
            groups.setdefault(group_ids[i], []).append(i)
        units = list(groups.values())  # longest first: a group's order is its longest row's

    def cost(rows: list[int]) -> int:
        return len(rows) * (max(prompt[i] for i in rows) + max(1, max(response[i] for i in rows)))

    out: list[list[int]] = []
    current: list[int] = []
    for unit in units:
        if len(unit) > 1 and cost(unit) > budget:
            out += [current] if current else []
            split = token_chunks([prompt[i] for i in unit], [response[i] for i in unit], budget)
            out += [[unit[j] for j in c] for c in split]
            current = []
        elif current and cost(current + unit) > budget:
            out.append(current)
            current = list(unit)
        else:
            current += unit
    if current:
        out.append(current)
    return out


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


class MetricAccumulator:
    """Per-chunk metrics combined as each metric declares (see ``MetricAdapter.reductions``).

    ``mean`` is weighted by the chunk's weight (its objective weight for TOKEN_SUM, 1 for MEAN);
    ``sum``/``max``/``min`` are exact; ``last`` keeps the latest chunk's value. A chunk counts
    only for the names it reports. :meth:`all_reduce` makes the values global over ranks with
    the same declarations, so a rank-merged ``max`` is the true global maximum.
    """

    def __init__(self, reductions: Mapping[str, MetricReduce] | Callable[[str], MetricReduce]):
        self._reduce = reductions if callable(reductions) else lambda n: reductions.get(n, "mean")
        self._values: dict[str, list[float]] = {}
        self._weights: dict[str, list[float]] = {}

    def add(self, metrics: Mapping[str, Any], weight: float = 1.0) -> None:
        for name, value in metrics.items():
            if name in CONTROL_METRICS:
                continue
            self._values.setdefault(name, []).append(_scalar(name, value))
            self._weights.setdefault(name, []).append(float(weight))

    def result(self) -> dict[str, float]:
        return {
            name: combine(self._reduce(name), vals, self._weights[name])
            for name, vals in self._values.items()
        }

    def all_reduce(self) -> dict[str, float]:
        """:meth:`result` over every rank (one collective per reduction kind in use)."""
        local = self.result()
        if not dp.is_distributed():
            return local
        names = sorted(local)
        lo, hi = dp.all_reduce_floats([-len(names), len(names)], "max")
        if -lo != hi:
            raise ObjectiveContractError(
                "ranks report different objective metric names; an objective must report the "
                "same metrics for every chunk shape"
            )
        out: dict[str, float] = {}
        by_kind: dict[str, list[str]] = {}
        for name in names:
            by_kind.setdefault(self._reduce(name), []).append(name)
        for kind, group in by_kind.items():
            if kind == "mean":
                weights = [sum(self._weights[n]) for n in group]
                sums = dp.all_reduce_floats(
                    [local[n] * w for n, w in zip(group, weights, strict=True)] + weights
                )
                k = len(group)
                out.update({n: sums[i] / sums[k + i] if sums[k + i] else local[n]
                            for i, n in enumerate(group)})  # fmt: skip
            else:
                out.update(zip(group, _all_reduce_kind(kind, [local[n] for n in group]),
                               strict=True))  # fmt: skip
        return out


def _all_reduce_kind(kind: str, values: list[float]) -> list[float]:
    if kind == "last":  # the last rank's value, as the last chunk's is within a rank
        mine = dp.rank() == dp.world_size() - 1
        return dp.all_reduce_floats([v if mine else 0.0 for v in values])
    return dp.all_reduce_floats(values, kind)


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
    lockstep: bool = False,
) -> Accumulation:
    """Run ``objective`` on each chunk, backward, and leave the step's exact gradient in ``.grad``.

    The caller zeroes gradients first. Collectives run on every rank (also one with no chunks),
    so all ranks of a data-parallel group must call this together. ``lockstep`` (a sharded model,
    whose every forward and backward is a collective): every rank runs the same number of
    forward+backward passes, padding with ghost passes that contribute exactly nothing, and the
    gradients arrive already summed over ranks (FSDP's reduce-scatter), so none is all-reduced.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    passes = [(c, True) for c in chunks]
    if lockstep:
        from posttrain.trainer.sharding import ghost_rows, lockstep_ghosts

        ghosts = lockstep_ghosts(len(chunks))
        passes += [(ghost_rows(chunks), False)] * ghosts if ghosts else []
    fn = _token_sum if objective.reduction is Reduction.TOKEN_SUM else _mean
    return fn(model, objective, passes, params, forward_context, lockstep)


def _token_sum(model, objective, passes, params, forward_context, lockstep) -> Accumulation:
    numerator, weight = 0.0, 0.0
    means = MetricAccumulator(objective.metric_adapter.reduction)
    real = 0
    for chunk, is_real in passes:
        with forward_context():
            loss, metrics = objective(model, chunk)
        w = float(metrics[OBJECTIVE_WEIGHT_SUM])
        if not is_real:  # a ghost: the collectives of a pass, a gradient of exactly zero
            (loss * 0.0).backward()
            continue
        real += 1
        if w > 0:
            # A chunk with weight 0 carries no loss terms; skipping it also avoids 0 * nan.
            chunk_numerator = loss * w
            chunk_numerator.backward()
            numerator += float(chunk_numerator.detach())
            weight += w
        elif lockstep:  # the pass still has to run; a TOKEN_SUM loss at weight 0 is finite
            (loss * 0.0).backward()
        means.add(metrics, w)
    chunks = real
    numerator, weight = dp.all_reduce_floats([numerator, weight])
    _materialise_grads(params)
    if not lockstep:
        dp.all_reduce_grads_(params)
    if weight == 0:
        for p in params:
            p.grad.zero_()
        return Accumulation(0.0, 0.0, chunks, means.all_reduce(), empty=True)
    torch._foreach_div_([p.grad for p in params], weight)
    return Accumulation(numerator / weight, weight, chunks, means.all_reduce())


def _mean(model, objective, passes, params, forward_context, lockstep) -> Accumulation:
    total = 0.0
    means = MetricAccumulator(objective.metric_adapter.reduction)
    n = sum(is_real for _, is_real in passes)
    for chunk, is_real in passes:
        with forward_context():
            loss, metrics = objective(model, chunk)
        if not is_real:
            (loss * 0.0).backward()
            continue
        (loss / n).backward()
        total += float(loss.detach())
        means.add(metrics, 1.0)
    local_mean = total / n if n else 0.0
    loss_sum, contributing = dp.all_reduce_floats([local_mean, 1.0 if n else 0.0])
    _materialise_grads(params)
    if not lockstep:
        dp.all_reduce_grads_(params)
    if contributing == 0:
        return Accumulation(0.0, 0.0, 0, means.all_reduce(), empty=True)
    if contributing != 1:
        torch._foreach_div_([p.grad for p in params], contributing)
    return Accumulation(loss_sum / contributing, contributing, n, means.all_reduce())


def merge_steps(rows: Sequence[Mapping[str, float]], reductions: Mapping[str, MetricReduce]):
    """One record from several optimizer steps' records, each metric as it declares."""
    out: dict[str, float] = {}
    for key in sorted({k for r in rows for k in r}):
        vals = [float(r[key]) for r in rows if key in r]
        out[key] = combine(reductions.get(key, "mean"), vals, [1.0] * len(vals))
    return out
