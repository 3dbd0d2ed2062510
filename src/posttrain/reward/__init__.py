"""Verifiers, user reward functions and the reward stage (scores + group annotators).

The stage's names load on first use (PEP 562): it computes with torch, and preflight checks a
recipe's ``reward.functions`` through :mod:`posttrain.reward.functions` without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from posttrain.reward.extract import extract_answer, follows_format, marked_answer
from posttrain.reward.functions import (
    RewardFunction,
    RewardFunctionSpecError,
    load_reward_function,
)
from posttrain.reward.verifiers import VERIFIERS, get_verifier

_STAGE = ("RewardError", "RewardResult", "RewardStage", "RowScores")

__all__ = [
    "VERIFIERS",
    "RewardError",
    "RewardFunction",
    "RewardFunctionSpecError",
    "RewardResult",
    "RewardStage",
    "RowScores",
    "extract_answer",
    "follows_format",
    "get_verifier",
    "load_reward_function",
    "marked_answer",
]


def __getattr__(name: str) -> Any:
    if name in _STAGE:
        return getattr(importlib.import_module("posttrain.reward.stage"), name)
    raise AttributeError(f"module 'posttrain.reward' has no attribute {name!r}")
