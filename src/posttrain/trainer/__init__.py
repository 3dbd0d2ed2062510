"""Trainer core (placement, optimizer, precision, exact accumulation, checkpoints and resume)
and the LLM layer on it (π_old, token counts)."""

from posttrain.trainer.accumulate import (
    Accumulation,
    accumulate_gradients,
    row_chunks,
    split_evenly,
)
from posttrain.trainer.checkpoint import RESUME_MODES, CheckpointManager, ResumeState
from posttrain.trainer.compat import RESUME_MUTABLE_KEYS
from posttrain.trainer.core import Trainer
from posttrain.trainer.errors import (
    CheckpointError,
    NondeterministicForwardError,
    NonFiniteTrainingError,
    PiOldNotCapturedError,
    PoisonedStateError,
    ResumeError,
    TrainerError,
)
from posttrain.trainer.llm import LLMTrainer

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
    "Trainer",
    "TrainerError",
    "accumulate_gradients",
    "row_chunks",
    "split_evenly",
]
