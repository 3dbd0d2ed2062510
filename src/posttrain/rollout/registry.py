"""``rollout.engine`` names -> engines: the one factory, and their declared capabilities.

Torch-free until an engine is built, so preflight reads capabilities without importing torch.
Adding an engine is one entry here (its class implements ``rollout.base.RolloutEngine``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.rollout import capabilities as caps

if TYPE_CHECKING:
    from posttrain.rollout.base import RolloutEngine


@dataclass(frozen=True)
class EngineEntry:
    """Where an engine's class lives (``module:Class``) and what it declares."""

    target: str
    capabilities: caps.EngineCapabilities


ENGINES: dict[str, EngineEntry] = {
    "torch": EngineEntry("posttrain.rollout.torch_engine:TorchRolloutEngine", caps.TORCH),
    "static": EngineEntry("posttrain.rollout.graph_engine:GraphRolloutEngine", caps.STATIC),
    "vllm": EngineEntry("posttrain.rollout.vllm_engine:VllmRolloutEngine", caps.VLLM),
}


def engine_capabilities(name: str) -> caps.EngineCapabilities:
    """The capabilities ``rollout.engine=name`` declares."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine={name} is not an engine; use one of {sorted(ENGINES)}")
    return ENGINES[name].capabilities


def engines_with(**wanted: Any) -> list[str]:
    """The engine names whose capabilities have every ``field=value`` in ``wanted``."""
    return [
        name
        for name, e in ENGINES.items()
        if all(getattr(e.capabilities, k) == v for k, v in wanted.items())
    ]


def engine_class(name: str) -> type:
    """The class behind ``rollout.engine=name`` (imports it); it must declare what the registry
    says, so preflight's reading and the engine that runs agree."""
    expected = engine_capabilities(name)
    module, cls = ENGINES[name].target.split(":")
    engine = getattr(importlib.import_module(module), cls)
    if engine.capabilities != expected:
        raise TypeError(f"{engine.__name__} declares other capabilities than rollout.engine={name}")
    return engine


def build_engine(name: str, model: Any, tokenizer: Any = None, **kw: Any) -> RolloutEngine:
    """The engine ``rollout.engine=name`` over ``model`` (and its tokenizer)."""
    return engine_class(name)(model, tokenizer, **kw)
