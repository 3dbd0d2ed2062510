"""Sampling engines: the interface (``rollout.base``), the registry, and the built-in engines.

Imports are lazy so that ``rollout.registry`` (capabilities, read by preflight) stays torch-free.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EngineCapabilities": "posttrain.rollout.capabilities",
    "GraphRolloutEngine": "posttrain.rollout.graph_engine",
    "Rollout": "posttrain.rollout.base",
    "RolloutEngine": "posttrain.rollout.base",
    "TorchRolloutEngine": "posttrain.rollout.torch_engine",
    "VllmRolloutEngine": "posttrain.rollout.vllm_engine",
    "WeightReceiver": "posttrain.rollout.base",
    "build_engine": "posttrain.rollout.registry",
    "sample_tokens": "posttrain.rollout.sampling",
    "sampling_logprobs": "posttrain.rollout.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posttrain.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
