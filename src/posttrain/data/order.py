"""The rows of an offline step: consecutive slots of per-epoch seeded permutations.

A pure function of (seed, step), so an offline run (DPO's pairs, SFT's rows) resumes at any
step with no data cursor and replays the same rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def step_indices(n: int, seed: int, step: int, per_step: int) -> Tensor:
    """Indices into ``n`` rows of ``step`` (1-based): slots ``(step-1)*per_step ..`` of the
    concatenated permutations of epochs 0, 1, ... (epoch ``e`` seeded by ``seed * 7919 + e``)."""
    slots = torch.arange((step - 1) * per_step, step * per_step)
    rows = []
    for epoch in torch.unique(slots // n).tolist():
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        rows.append(perm[slots[slots // n == epoch] % n])
    return torch.cat(rows)
