"""Input checks shared by the loss primitives: fail loudly, never broadcast silently."""

from __future__ import annotations

import torch
from torch import Tensor


class NonFiniteInputError(ValueError):
    """A loss input holds NaN or inf: the trainer treats the step as non-finite (skip, count)."""


class ObjectiveContractError(ValueError):
    """An objective broke the contract (missing weight, non-scalar loss, unmapped metric), or
    was called without what it declared it needs (π_old not armed for these rows)."""


def check_finite(name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteInputError(f"{name} contains NaN or inf")


def check_shape(name: str, t: Tensor, shape: torch.Size | tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def as_bool_mask(mask: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
    """A boolean or 0/1 mask of exactly ``shape`` as a bool tensor; anything else raises."""
    check_shape("mask", mask, shape)
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must be boolean or contain only 0 and 1")
    return mask != 0
