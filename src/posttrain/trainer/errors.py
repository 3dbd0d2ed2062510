"""Errors the trainer raises, one type per thing a user must act on differently."""

from __future__ import annotations


class TrainerError(RuntimeError):
    """Base class for trainer failures."""


class PiOldNotCapturedError(TrainerError):
    """An objective that consults π_old was asked to update before π_old was captured."""


class NondeterministicForwardError(TrainerError):
    """``certified_deterministic_forward`` was claimed but two identical forwards differ."""


class NonFiniteTrainingError(TrainerError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient."""


class CheckpointError(TrainerError):
    """A checkpoint could not be written or read."""


class PoisonedStateError(CheckpointError):
    """Refusing to save a model or optimizer state that holds NaN or inf."""


class ResumeError(CheckpointError):
    """Resuming is impossible or would mix incompatible runs."""
