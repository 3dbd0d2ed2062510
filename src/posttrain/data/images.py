"""Image batches for diffusion training: rows that slice, index and move like TrajectoryBatch.

Images are float tensors ``[B, 3, H, W]`` in ``[-1, 1]`` (the range a DDPM is trained in),
``labels`` are class ids ``[B]`` and ``seeds`` one int64 per row. A row's seed fixes the
timestep and noise its loss is taken at (see :func:`posttrain.algorithm.dpo.row_noise`), so a
row's loss is the same however the batch is split into micro-batches, across ranks or resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def _take(value: Tensor, index: slice | Sequence[int] | Tensor) -> Tensor:
    if isinstance(index, slice):
        return value[index]
    return value[torch.as_tensor(index, dtype=torch.long, device=value.device)]


@dataclass(frozen=True)
class _Rows:
    """Shared row behaviour: every tensor field has the batch dimension first."""

    def __post_init__(self) -> None:
        sizes = {f.name: getattr(self, f.name).shape[0] for f in dataclasses.fields(self)}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"{type(self).__name__}: fields disagree on the row count {sizes}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])  # type: ignore[attr-defined]

    def __getitem__(self, index: slice | Sequence[int] | Tensor):
        if isinstance(index, int):
            index = slice(index, index + 1)
        values = {f.name: _take(getattr(self, f.name), index) for f in dataclasses.fields(self)}
        return type(self)(**values)

    def to(self, device: torch.device | str):
        values = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        return type(self)(**values)

    def with_seeds(self, seeds: Tensor):
        """The same rows with new per-row noise seeds (a fresh draw for a new step)."""
        return dataclasses.replace(self, seeds=seeds.to(torch.int64))


@dataclass(frozen=True)
class ImageBatch(_Rows):
    """Images with their class labels: what a plain denoising loss trains on."""

    images: Tensor
    labels: Tensor
    seeds: Tensor


@dataclass(frozen=True)
class PairBatch(_Rows):
    """Preference pairs: ``chosen`` is preferred to ``rejected`` under condition ``labels``."""

    chosen: Tensor
    rejected: Tensor
    labels: Tensor
    seeds: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chosen.shape != self.rejected.shape:
            raise ValueError(
                f"PairBatch: chosen {tuple(self.chosen.shape)} and rejected "
                f"{tuple(self.rejected.shape)} differ in shape"
            )

    def winners(self) -> ImageBatch:
        """The chosen images alone: what fine-tuning on winners trains on."""
        return ImageBatch(self.chosen, self.labels, self.seeds)


#: Rows one step may seed distinctly (the stride between consecutive steps' seeds).
ROWS_PER_STEP = 4096


def step_seeds(seed: int, step: int, rows: int) -> Tensor:
    """Noise seeds of one step's rows: a pure function of (seed, step, row), so resume needs
    no RNG state and a pair seen again at a later step gets a fresh timestep and noise."""
    if not 0 <= rows <= ROWS_PER_STEP:
        raise ValueError(f"step_seeds: {rows} rows in one step; at most {ROWS_PER_STEP}")
    base = (seed * 1_000_003 + step) * ROWS_PER_STEP
    return (torch.arange(rows, dtype=torch.int64) + base) % (2**62)
