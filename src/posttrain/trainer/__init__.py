"""Trainer: placement, optimizer, precision, exact accumulation, π_old, checkpoints and resume."""

from posttrain.trainer.accumulate import (
    Accumulation,
    accumulate_gradients,
    row_chunks,
    split_evenly,
)
from posttrain.trainer.checkpoint import RESUME_MODES, CheckpointManager, ResumeState
from posttrain.trainer.compat import RESUME_MUTABLE_KEYS
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
    "RESUME_MODES",
    "RESUME_MUTABLE_KEYS",
    "Accumulation",
    "CheckpointError",
    "CheckpointManager",
    "LLMTrainer",
    "NonFiniteTrainingError",
    "NondeterministicForwardError",
    "PiOldNotCapturedError",
    "PoisonedStateError",
    "ResumeError",
    "ResumeState",
    "TrainerError",
    "accumulate_gradients",
    "row_chunks",
    "split_evenly",
]
