"""What each engine declares about itself, torch-free: preflight reads it without loading one.

``multi_turn``: the engine implements ``generate_turns`` (multi-turn environments need it).
``logprobs``: the semantics of the log-probs it returns; ``processed`` (the only one a rollout
accepts) is the log-prob of the distribution actually sampled, after temperature and top-p.
``in_process``: the engine samples with a torch module in the caller's process, so it can share
the policy module (a float32 local run then syncs nothing); else it holds its own copy
elsewhere and every sync sends the weights.
``adapter_sync``: a LoRA policy's sync always sends its adapters alone (the rollout merges them
onto its float32 base copy). vLLM declares False: whether it gets adapters (its LoRA path) or
merged full weights is the run's choice, ``vllm.lora_sync`` (``placement.roles.sends_adapters``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LogprobSemantics = Literal["processed"]


@dataclass(frozen=True)
class EngineCapabilities:
    """An engine's declaration (a class attribute; the registry holds one per engine name)."""

    multi_turn: bool
    logprobs: LogprobSemantics
    in_process: bool = True
    adapter_sync: bool = True


TORCH = EngineCapabilities(multi_turn=True, logprobs="processed")
STATIC = EngineCapabilities(multi_turn=False, logprobs="processed")
VLLM = EngineCapabilities(
    multi_turn=True, logprobs="processed", in_process=False, adapter_sync=False
)
