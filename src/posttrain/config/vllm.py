"""The ``vllm`` section: how ``rollout.engine=vllm`` runs vLLM (read only with that engine).

The sampled dtype stays ``rollout.dtype`` (one owner for every engine); the sampling parameters
stay in ``rollout``. These are vLLM's own engine settings on the CPU build: the KV space, the
context it reserves, eager or compiled forwards, prefix caching, and how a LoRA policy's weights
reach it, and how many workers it is split across.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import Section


class VllmConfig(Section):
    """vLLM's engine settings for ``rollout.engine=vllm``."""

    section_name = "vllm"

    kv_cache_space_gib: float = Field(
        1.0,
        gt=0,
        description="KV-cache memory vLLM reserves, in GiB, per tensor-parallel worker (its "
        "`kv_cache_memory_bytes`, which overrides its `gpu_memory_utilization` on a GPU; "
        "`VLLM_CPU_KVCACHE_SPACE` in the environment is ignored); bounds how many tokens of all "
        "running rows it holds at once.",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="vLLM's `gpu_memory_utilization` on a GPU build (the CPU build reads "
        "none): at start vLLM refuses to load unless this fraction of the GPU is free, "
        "whatever `vllm.kv_cache_space_gib` reserves, so beside a trainer on the same GPU it "
        "must stay below the fraction the trainer leaves free. 0.3 as TRL's colocate mode; "
        "vLLM's own default, 0.9, assumes a GPU of its own.",
    )
    max_model_len: int | None = Field(
        None,
        gt=0,
        description="Longest prompt plus response vLLM plans for (its `max_model_len`); null: the "
        "model's own context length. A prompt plus `rollout.max_tokens` above it is refused, and "
        "so is a multi-turn trajectory's turn that would pass it (keep `env.max_context` below).",
    )
    enforce_eager: bool = Field(
        True,
        description="Eager forwards (vLLM's `enforce_eager`). False compiles the model with "
        "torch.compile at start: on this CPU about 2x the tokens/s in bf16 and 1-2 minutes more "
        "to load.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="vLLM's prefix cache: the n samples of a prompt (one request each) share its "
        "prefill, and a multi-turn trajectory's next turn reuses the KV blocks of its earlier "
        "ones (without it every turn prefills the whole trajectory again). Dropped after every "
        "weight sync, so no KV of old weights is reused.",
    )

    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="vLLM workers the model is split across (its `tensor_parallel_size`): "
        "attention heads and MLP columns shared out, one all-reduce per layer. On a GPU build, "
        "one GPU each (from the rollout's device on); on the CPU build, a NUMA node each where "
        "there are enough (vLLM's binding), else a share of this process's cores each (unless "
        "`VLLM_CPU_OMP_THREADS_BIND` says otherwise). The model's attention heads must divide "
        "by it, and its key/value heads divide it or by it.",
    )

    lora_sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="How a LoRA policy's weights reach vLLM after each update. `merged`: "
        "base + B A for every adapted weight, as a full-weight reload (vLLM samples a plain "
        "model; the whole model's bytes every sync). `adapter`: the adapters alone, loaded as a "
        "new adapter version through vLLM's LoRA path (vLLM keeps the base it loaded and runs "
        "the adapter matmuls while sampling; ranks up to 512; vLLM's CPU build then runs eager "
        "whatever `vllm.enforce_eager` says). On this CPU, SmolLM2 with rank 16: a sync of "
        "3.0 s vs 0.16 s, sampling at 41 vs 17 tokens/s (docs/guides/vllm.md). Read only with "
        "`model.lora_rank > 0`.",
    )

    @field_validator("kv_cache_space_gib")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value
