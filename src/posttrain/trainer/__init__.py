"""Trainer: placement, optimizer, precision, exact accumulation, π_old, checkpoints and resume."""

from posttrain.trainer.accumulate import (
    Accumulation,
    accumulate_gradients,
    row_chunks,
    split_evenly,
)
from posttrain.trainer.errors import (
    CheckpointError,
    NondeterministicForwardError,
    NonFiniteTrainingError,
    PiOldNotCapturedError,
    PoisonedStateError,
    ResumeError,
    TrainerError,
)
from posttrain.trainer.trainer import LLMTrainer

__all__ = [
    "Accumulation",
    "CheckpointError",
    "LLMTrainer",
    "NonFiniteTrainingError",
    "NondeterministicForwardError",
    "PiOldNotCapturedError",
    "PoisonedStateError",
    "ResumeError",
    "TrainerError",
    "accumulate_gradients",
    "row_chunks",
    "split_evenly",
]
