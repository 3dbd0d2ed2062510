"""Per-row reward scores: what the reward stage computes for each row before any group logic.

Their own module because three owners pass them around: the reward stage writes them, dynamic
sampling keeps or drops rows by them (``select``, ``concat``), and the reward role hands them
from scoring a step's rounds to annotating the batch it keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowScores:
    """Per-row reward components (all ``[N]``, float64 unless noted) and their sum."""

    rewards: Tensor
    verifier: Tensor
    correct: Tensor  # bool: verifier score == 1
    format_ok: Tensor  # bool
    functions: dict[str, Tensor]  # each function's own values, before the weight below
    env: Tensor | None = None  # the environment's reward (multi-turn rollouts only)
    functions_weight: float = 1.0  # what the functions' sum counted in ``rewards`` with

    def select(self, rows: Tensor) -> RowScores:
        """The scores of ``rows`` (an index or bool mask), in order."""
        return RowScores(
            self.rewards[rows], self.verifier[rows], self.correct[rows], self.format_ok[rows],
            {k: v[rows] for k, v in self.functions.items()},
            None if self.env is None else self.env[rows], self.functions_weight,
        )  # fmt: skip

    @staticmethod
    def concat(parts: Sequence[RowScores]) -> RowScores:
        """The rows of ``parts`` in order (scored with one functions weight: one step's)."""
        weights = {p.functions_weight for p in parts}
        if len(weights) != 1:
            raise ValueError(f"reward stage: rows scored with functions weights {sorted(weights)}")
        cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        return RowScores(
            cat("rewards"), cat("verifier"), cat("correct"), cat("format_ok"),
            {k: torch.cat([p.functions[k] for p in parts]) for k in parts[0].functions},
            None if parts[0].env is None else cat("env"), weights.pop(),
        )  # fmt: skip
