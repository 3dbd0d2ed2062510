"""The sampling phase of an online step: one round, or DAPO dynamic sampling.

A group whose rewards are all equal has zero advantage under a group baseline and teaches
nothing. With dynamic sampling a step keeps drawing ``prompts_per_step`` fresh prompts per round
(the data cursor advances by that much every round), keeps only informative groups, and stops
once it holds ``prompts_per_step`` of them (extra ones from the last round are dropped, as in
DAPO) or after ``max_rounds`` rounds. A step that found none trains on its last round unfiltered,
exactly as without dynamic sampling. Everything is a pure function of (seed, step, round,
cursor), so a resumed run samples the same rounds.

Advantages are computed afterwards on the kept batch (the reward stage's second half), so
batch-level statistics see exactly the rows that train.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from posttrain.data.tasks import TaskItem
from posttrain.reward.scores import RowScores
from posttrain.rollout.base import Rollout
from posttrain.rollout.concat import concat_rollouts, keep_groups

#: take(cursor, count) -> (items, cursor after them)
Take = Callable[[int, int], tuple[list[TaskItem], int]]
#: generate(items, round) -> rollout with rollout.n rows per item, in item order
Generate = Callable[[Sequence[TaskItem], int], Rollout]
#: score(rollout, items) -> per-row scores (rollout row i answers items[i // n])
Score = Callable[[Rollout, Sequence[TaskItem]], RowScores]


@dataclass(frozen=True)
class Sampled:
    """What a step trains on: the rollout, one task item per group, the rows' scores, the data
    cursor after every round, ``sampling/*`` metrics, and the response tokens generated over
    all rounds (kept or not: the sampling cost)."""

    rollout: Rollout
    items: list[TaskItem]
    scores: RowScores
    cursor: int
    metrics: dict[str, float]
    generated_tokens: int


def informative(rewards: torch.Tensor, n: int) -> torch.Tensor:
    """``[G]`` bool: groups (``n`` consecutive rows each) whose rewards are not all equal."""
    grouped = rewards.view(-1, n)
    return grouped.amax(1) != grouped.amin(1)


def sample_step(
    cursor: int,
    *,
    prompts: int,
    take: Take,
    generate: Generate,
    score: Score,
    dynamic: bool,
    max_rounds: int,
) -> Sampled:
    """Sample one step's groups from ``cursor`` (one round unless ``dynamic``)."""
    rounds = max_rounds if dynamic else 1
    parts: list[tuple[Rollout, list[TaskItem], RowScores]] = []
    kept = generated = 0
    for rnd in range(rounds):
        items, cursor = take(cursor, prompts)
        rollout = generate(items, rnd)
        generated += int(rollout.response_lengths.sum())
        scores = score(rollout, items)
        if not dynamic:
            return Sampled(rollout, items, scores, cursor, {}, generated)
        good = informative(scores.rewards, rollout.n)
        take_idx = good.nonzero().squeeze(-1)[: prompts - kept]
        keep = torch.zeros_like(good)
        keep[take_idx] = True
        if take_idx.numel():
            rows = keep.repeat_interleave(rollout.n)
            parts.append(
                (keep_groups(rollout, keep), [items[i] for i in take_idx.tolist()],
                 scores.select(rows))
            )  # fmt: skip
            kept += take_idx.numel()
        if kept == prompts:
            break
    metrics = {
        "sampling/rounds": float(rnd + 1),
        "sampling/shortfall_groups": float(prompts - kept),
        "sampling/kept_groups": float(kept),
    }
    if not parts:  # nothing informative: train on the last round as it came
        return Sampled(rollout, items, scores, cursor, metrics, generated)
    return Sampled(
        concat_rollouts([p[0] for p in parts]),
        [it for p in parts for it in p[1]],
        RowScores.concat([p[2] for p in parts]),
        cursor,
        metrics,
        generated,
    )
