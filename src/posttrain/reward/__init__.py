"""Verifiers, user reward functions and the reward stage (scores + group annotators)."""

from posttrain.reward.extract import extract_answer, follows_format, marked_answer
from posttrain.reward.functions import (
    RewardFunction,
    RewardFunctionSpecError,
    load_reward_function,
)
from posttrain.reward.stage import RewardError, RewardResult, RewardStage, RowScores
from posttrain.reward.verifiers import VERIFIERS, get_verifier

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
