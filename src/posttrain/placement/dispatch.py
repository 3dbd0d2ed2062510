"""Dispatch of a scored batch to data-parallel policy ranks.

Each rank receives whole sequences (rows); group statistics such as advantages were computed by
the reward stage while every group was complete, so a rank never needs rows it does not hold.

The split is chosen so that several ranks take the same optimizer steps as one: the batch is
first cut into the mini-batches one rank would use, and each mini-batch is then shared out among
the ranks. Because ``split_evenly`` is used at both levels (sizes differ by at most one, larger
first), a rank's shard, cut again into mini-batches by the trainer, yields exactly its share of
every global mini-batch. The trainer's cross-rank normalisation then makes the update equal to
the single-rank one (up to the order of floating-point sums).

With ``group_ids`` (``keep_groups``: the shared-prefix forward is on and the objective is
TOKEN_SUM), each mini-batch's rows are first brought together by group, so a rank's part cuts at
most the groups at its two ends and each prompt is encoded by as few ranks as the split allows.
That only permutes rows within one optimizer step, which TOKEN_SUM's global normalisation makes
exact; for a rollout, whose groups are contiguous already, it is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from posttrain.data.trajectory import TrajectoryBatch
from posttrain.trainer.accumulate import group_order, split_evenly


def rank_rows(
    rows: int,
    ranks: int,
    mini_batches: int,
    group_ids: Sequence[int] | None = None,
    whole_groups: bool = False,
) -> list[list[int]]:
    """Row indices of every rank's shard (see the module docstring for why this order).
    ``whole_groups``: the groups of ``group_ids`` (each within one mini-batch), not the rows,
    are shared out, so no group is cut (a DPO pair, a held-out set)."""
    if ranks < 1 or mini_batches < 1:
        raise ValueError(f"need ranks >= 1 and mini_batches >= 1, got {ranks}, {mini_batches}")
    if whole_groups and group_ids is None:
        raise ValueError("whole_groups needs the rows' group_ids")
    if rows < ranks * mini_batches:
        raise ValueError(
            f"a batch of {rows} rows cannot give each of {ranks} policy ranks a row in each of "
            f"{mini_batches} mini-batches; raise data.prompts_per_step or rollout.n, or lower "
            "placement.policy_ranks or rl.mini_batch_per_replica"
        )
    shards: list[list[int]] = [[] for _ in range(ranks)]
    for mini in split_evenly(rows, mini_batches):
        idx = list(range(mini.start, mini.stop))
        if group_ids is not None:
            idx = [idx[i] for i in group_order([group_ids[j] for j in idx])]
        units = (
            _runs([group_ids[j] for j in idx]) if whole_groups else [[i] for i in range(len(idx))]
        )
        if len(units) < ranks:
            raise ValueError(f"{len(units)} groups cannot give each of {ranks} ranks one")
        for rank, part in enumerate(split_evenly(len(units), ranks)):
            shards[rank].extend(idx[i] for unit in units[part] for i in unit)
    return shards


def _runs(ids: Sequence[int]) -> list[list[int]]:
    """Positions of ``ids`` in runs of equal values (each group's rows, brought together)."""
    positions = groupby(range(len(ids)), key=ids.__getitem__)
    return [list(run) for _, run in positions]


def shard_batch(
    batch: TrajectoryBatch,
    ranks: int,
    mini_batches: int,
    keep_groups: bool = False,
    whole_groups: bool = False,
) -> list[TrajectoryBatch]:
    """Every rank's rows of ``batch``; one rank gets the batch itself. ``keep_groups``: each
    mini-batch's groups brought together (a rank's part cuts at most the groups at its ends);
    ``whole_groups``: none cut."""
    if ranks == 1:
        return [batch]
    groups = batch.group_ids.tolist() if keep_groups or whole_groups else None
    return [batch[idx] for idx in rank_rows(len(batch), ranks, mini_batches, groups, whole_groups)]
