"""Capabilities of a policy model's forward pass, read by the trainer and the model adapter.

These describe the *model* (what its forward can promise), never the loss: an objective must not
hold or import them. They are derived once, from the HF config plus the few claims a user makes in
the model config section, and then passed around as a frozen value.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

# Tolerated |logp(recomputed) - logp(earlier pass)| for the same weights and tokens when the
# forward is not certified deterministic: kernel choice and batch layout reorder float sums.
DEFAULT_NOISE_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.bfloat16: 5e-2,
    torch.float16: 1e-2,
}


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model's forward pass supports and promises.

    - ``certified_deterministic_forward``: the user certifies that the same weights and tokens give
      bit-identical logprobs regardless of batch layout (e.g. deterministic kernels, no MoE routing
      flips). The trainer may then compare π_old with π exactly (tolerance 0).
    - ``forward_noise_tolerance``: the largest per-token logprob difference the trainer treats as
      forward noise rather than a weight change; 0.0 when certified.
    - ``is_moe`` / ``routing_replay``: mixture-of-experts routing, and whether routing decisions of
      the rollout are replayed in the training forward (only meaningful for MoE).
    - ``kv_cache``, ``position_ids``, ``logits_to_keep``: forward keywords the rollout engine and
      the logprob helper rely on (explicit positions are how left padding stays exact).
    - ``max_positions``: the model's context bound (None when the config states none), for preflight
      of prompt length + ``rollout.max_tokens``.
    """

    certified_deterministic_forward: bool
    forward_noise_tolerance: float
    is_moe: bool
    routing_replay: bool
    kv_cache: bool
    position_ids: bool
    logits_to_keep: bool
    max_positions: int | None
    vocab_size: int
    dtype: torch.dtype


def _is_moe(config) -> bool:
    for key in _MOE_KEYS:
        val = getattr(config, key, None)
        if isinstance(val, int) and val > 1:
            return True
    return False


HF_CAUSAL_LM_FORWARD = frozenset({"position_ids", "logits_to_keep", "cache", "use_cache"})
"""Forward keywords of a current transformers causal LM (what ``capabilities_from_config`` assumes
when no forward signature is given)."""


def capabilities_from_config(
    config,
    dtype: torch.dtype,
    *,
    forward_params: Collection[str] = HF_CAUSAL_LM_FORWARD,
    certified_deterministic_forward: bool = False,
    routing_replay: bool = False,
    forward_noise_tolerance: float | None = None,
) -> ModelCapabilities:
    """Derive capabilities from an HF ``PretrainedConfig`` and the user's claims.

    Refuses claims the model cannot honour: routing replay on a dense model (nothing to replay),
    and certification of an MoE model without routing replay (expert choice can flip under noise).
    """
    moe = _is_moe(config)
    if routing_replay and not moe:
        raise ValueError(
            "model.routing_replay=true but the model is dense (no experts in its config); "
            "remove the setting"
        )
    if certified_deterministic_forward and moe and not routing_replay:
        raise ValueError(
            "model.certified_deterministic_forward=true for a mixture-of-experts model without "
            "routing replay: expert routing can change between passes; enable routing replay or "
            "drop the certification"
        )
    if forward_noise_tolerance is not None and forward_noise_tolerance < 0:
        raise ValueError(
            f"model.forward_noise_tolerance must be >= 0, got {forward_noise_tolerance}"
        )
    if certified_deterministic_forward:
        tol = 0.0
    elif forward_noise_tolerance is not None:
        tol = float(forward_noise_tolerance)
    else:
        tol = DEFAULT_NOISE_TOLERANCE.get(dtype, 1e-4)
    max_pos = getattr(config, "max_position_embeddings", None)
    return ModelCapabilities(
        certified_deterministic_forward=certified_deterministic_forward,
        forward_noise_tolerance=tol,
        is_moe=moe,
        routing_replay=routing_replay,
        kv_cache=("cache" in forward_params or "past_key_values" in forward_params)
        and bool(getattr(config, "use_cache", True)),
        position_ids="position_ids" in forward_params,
        logits_to_keep="logits_to_keep" in forward_params,
        max_positions=int(max_pos) if isinstance(max_pos, int) else None,
        vocab_size=int(config.vocab_size),
        dtype=dtype,
    )


def model_capabilities(model: nn.Module, **claims) -> ModelCapabilities:
    """``capabilities_from_config`` for a loaded HF model: its config, parameter dtype and the
    keywords its ``forward`` accepts."""
    dtype = next(model.parameters()).dtype
    params = frozenset(inspect.signature(model.forward).parameters)
    return capabilities_from_config(model.config, dtype, forward_params=params, **claims)
