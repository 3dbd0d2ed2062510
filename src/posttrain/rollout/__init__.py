"""Sampling engines: the built-in torch engine and the interface other engines implement."""

from posttrain.rollout.base import Rollout, RolloutEngine
from posttrain.rollout.graph_engine import GraphRolloutEngine
from posttrain.rollout.sampling import sample_tokens, sampling_logprobs
from posttrain.rollout.torch_engine import TorchRolloutEngine

__all__ = [
    "GraphRolloutEngine",
    "Rollout",
    "RolloutEngine",
    "TorchRolloutEngine",
    "sample_tokens",
    "sampling_logprobs",
]
