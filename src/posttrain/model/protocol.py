"""Capabilities of a policy model's forward pass, checked before training starts.

These describe the *model* (what its forward can promise), never the loss: an objective must not
hold or import them. They are derived once, when the policy role loads its model, from the HF
config, the forward's signature and the claim a user makes in the ``model`` section; a claim the
model cannot honour, or a forward the trainer cannot drive exactly, is refused there in one line
instead of failing mid-step.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

from posttrain.config.errors import ConfigError

_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

HF_CAUSAL_LM_FORWARD = frozenset({"position_ids", "logits_to_keep", "cache", "use_cache"})
"""Forward keywords of a current transformers causal LM (what ``capabilities_from_config`` assumes
when no forward signature is given)."""


@dataclass(frozen=True)
class ModelCapabilities:
    """What a model's forward pass supports and promises.

    - ``certified_deterministic_forward``: the user certifies that the same weights and tokens give
      bit-identical logprobs regardless of batch layout; a frozen π_old is then checked bit for bit.
    - ``is_moe``: mixture-of-experts routing (expert choice can flip between passes).
    - ``kv_cache``, ``position_ids``, ``logits_to_keep``: forward keywords the rollout engine and
      the logprob helper rely on (explicit positions are how left padding stays exact).
    - ``max_positions``: the model's context bound (None when the config states none).
    """

    certified_deterministic_forward: bool
    is_moe: bool
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


def capabilities_from_config(
    config,
    dtype: torch.dtype,
    *,
    forward_params: Collection[str] = HF_CAUSAL_LM_FORWARD,
    certified_deterministic_forward: bool = False,
) -> ModelCapabilities:
    """Derive capabilities from an HF ``PretrainedConfig`` and the user's claim.

    Refuses certification of an MoE model: expert choice can flip under batch-layout noise, so
    two passes are not bit-identical.
    """
    moe = _is_moe(config)
    if certified_deterministic_forward and moe:
        raise ConfigError(
            "model.certified_deterministic_forward=true for a mixture-of-experts model: expert "
            "routing can change between passes; set model.certified_deterministic_forward=false"
        )
    max_pos = getattr(config, "max_position_embeddings", None)
    return ModelCapabilities(
        certified_deterministic_forward=certified_deterministic_forward,
        is_moe=moe,
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


def require_trainable(caps: ModelCapabilities, name: str) -> None:
    """The forward keywords exact log-probs need; a model without them is refused up front."""
    missing = [k for k in ("position_ids", "logits_to_keep") if not getattr(caps, k)]
    if missing:
        raise ConfigError(
            f"model {name!r}: its forward does not accept {', '.join(missing)}, which exact "
            "log-probs with left-padded prompts need; use a transformers causal LM that does"
        )
