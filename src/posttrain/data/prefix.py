"""The shared-prefix forward: each distinct prompt of a batch is encoded once.

A GRPO group is ``n`` responses to one prompt, so an unshared forward encodes that prompt ``n``
times. Here the distinct prompts of the batch run once with a KV cache (gradient-enabled when the
caller wants a gradient); the cache is then indexed out to every row (``keys[inverse]``, whose
backward sums the rows' gradients into their prompt, as the chain rule asks), and the responses run
against it. The outputs that predict the response tokens are the prompt's last position followed
by the responses' positions ``0 .. R-2`` (the last response token predicts nothing we score).

This is exact, not an approximation: with the same attention mask and position ids every response
position attends to the same keys and values as in the full-sequence forward, so outputs agree to
floating-point rounding (Prefix Grouper, arXiv 2506.05433, makes the same argument).

``rl.shared_prefix`` (:func:`shared_prefix_mode`) selects it: ``auto`` shares where the model
supports it and otherwise falls back to the full-sequence forward, saying why once in the log;
``on`` raises instead of falling back; ``off`` never shares. Supported: Hugging Face causal LMs whose
cache for this config is made of full-attention ``DynamicLayer`` s and sliding-window
``DynamicSlidingWindowLayer`` s, with ``eager`` or ``sdpa`` attention, not under ``torch.compile``,
and not training with activation checkpointing (HF drops the cache inside checkpointed layers).

A sliding layer keeps the prompt's last ``window - 1`` columns and masks the responses by column.
That is exact here because a batch row has no holes (its prompt left-padded, its response right
after it), so columns count tokens; the rollout's cache, which has holes, cannot rely on this
(``rollout/continuation.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from posttrain.config.errors import ConfigError
from posttrain.data.trajectory import DOCUMENT_POSITIONS, TrajectoryBatch

SharedPrefixMode = Literal["auto", "on", "off"]
MODES: tuple[str, ...] = ("auto", "on", "off")

_log = logging.getLogger(__name__)
_MODE: contextvars.ContextVar[str] = contextvars.ContextVar("shared_prefix", default="auto")
_SAID: set[str] = set()
_ATTENTION = (None, "eager", "sdpa")
#: The cache layers the responses can run against (a window counts columns: see above).
_SHAREABLE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)


class SharedPrefixUnsupported(ConfigError):
    """``rl.shared_prefix=on`` for a model or attention implementation that cannot share."""


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, so a padded prompt scores like an unpadded one."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def shared_prefix_mode() -> str:
    """The mode in force for forwards in this context (``auto`` unless set)."""
    return _MODE.get()


@contextlib.contextmanager
def use_shared_prefix(mode: str) -> Iterator[None]:
    """Run the forwards inside with ``mode`` (``auto``, ``on`` or ``off``)."""
    if mode not in MODES:
        raise ValueError(f"rl.shared_prefix must be one of {MODES}, got {mode!r}")
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


@dataclass(frozen=True)
class PromptGroups:
    """``first[g]``: the first row holding distinct prompt ``g``; ``inverse[b]``: row ``b``'s."""

    first: Tensor
    inverse: Tensor


def prompt_groups(batch: TrajectoryBatch) -> PromptGroups:
    """The distinct prompts of ``batch`` (token ids and padding alike), in order of first row."""
    p = batch.prompt_width
    key = torch.where(batch.attention_mask[:, :p].bool(), batch.input_ids[:, :p], -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(batch), device=key.device)
    g = int(inverse.max()) + 1
    first = torch.full((g,), len(batch), device=key.device).scatter_reduce(0, inverse, rows, "amin")
    # Renumber the groups by first row so the layout does not depend on token values' order.
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(g, device=key.device)
    return PromptGroups(first=first[order], inverse=rank[inverse])


def hf_model(module: nn.Module) -> PreTrainedModel | None:
    """The Hugging Face model inside ``module`` (itself, a peft base, a wrapper's policy)."""
    return next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)


def cache_keyword(module: nn.Module) -> str:
    """transformers 5 calls the cache keyword ``cache``; 4.x called it ``past_key_values``."""
    inner = hf_model(module)
    params = inspect.signature((inner or module).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def unsupported_reason(module: nn.Module) -> str | None:
    """Why ``module``'s forwards cannot share prompts (None when they can)."""
    from torch.distributed.fsdp import FSDPModule

    if hasattr(module, "_orig_mod"):
        return "the model runs under torch.compile"
    if isinstance(module, FSDPModule):  # every forward is a collective all ranks run together
        return (
            "the model is FSDP-sharded (ranks run their forwards in step, and a shared prompt "
            "takes two where a lone row takes one)"
        )
    inner = hf_model(module)
    if inner is None:
        return f"{type(module).__name__} is not a Hugging Face model"
    config = inner.config
    attn = getattr(config, "_attn_implementation", None)
    if attn not in _ATTENTION:
        return f"attention implementation {attn!r} (supported: eager, sdpa)"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder models have no single causal prefix"
    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) not in _SHAREABLE_LAYERS for layer in layers):
        return "the model's cache has layers other than full or sliding-window attention"
    if torch.is_grad_enabled() and any(
        getattr(m, "gradient_checkpointing", False) and m.training for m in module.modules()
    ):
        return "activation checkpointing drops the KV cache in a training forward"
    return None


def should_share(module: nn.Module, batch: TrajectoryBatch) -> PromptGroups | None:
    """The prompt groups to share over, or None for the full-sequence forward.

    None under ``off``, when no prompt repeats in ``batch`` (nothing to save), or (``auto``)
    when the model cannot share; ``on`` raises :class:`SharedPrefixUnsupported` then.
    """
    mode = shared_prefix_mode()
    if mode == "off" or len(batch) < 2 or batch.prompt_width == 0:
        return None
    if DOCUMENT_POSITIONS in batch.columns:  # a packed row's documents share nothing
        return None
    reason = unsupported_reason(module)
    if reason is not None:
        if mode == "on":
            raise SharedPrefixUnsupported(
                f"rl.shared_prefix=on but {reason}; set rl.shared_prefix=auto (falls back to "
                "encoding each row's prompt) or off"
            )
        if reason not in _SAID:
            _SAID.add(reason)
            _log.warning("shared-prefix forward off (%s): each row encodes its own prompt", reason)
        return None
    groups = prompt_groups(batch)
    return groups if len(groups.first) < len(batch) else None


def shared_outputs(
    module: nn.Module, batch: TrajectoryBatch, groups: PromptGroups, field: str, **kw
) -> Tensor:
    """``[B, R, X]`` ``module`` outputs (``field``: ``logits`` or ``last_hidden_state``) at the
    positions that predict each response token, with every prompt encoded once.

    ``kw`` goes to both forwards except ``logits_to_keep``, which this function sets.
    """
    p, r = batch.prompt_width, batch.response_width
    logits = field == "logits"
    cache = DynamicCache(config=hf_model(module).config)
    cache_kw = {cache_keyword(module): cache}
    mask = batch.attention_mask[groups.first, :p]
    out = module(
        input_ids=batch.input_ids[groups.first, :p],
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        use_cache=True,
        **({"logits_to_keep": 1} if logits else {}),
        **cache_kw,
        **kw,
    )
    last = getattr(out, field)[:, -1:][groups.inverse]
    if r == 1:
        return last
    for layer in cache.layers:  # index, not expand: its backward sums each group's rows
        layer.keys = layer.keys[groups.inverse]
        layer.values = layer.values[groups.inverse]
    mask = batch.attention_mask[:, : p + r - 1]
    out = module(
        input_ids=batch.input_ids[:, p : p + r - 1],
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask)[:, p:],
        use_cache=True,
        **({"logits_to_keep": r - 1} if logits else {}),
        **cache_kw,
        **kw,
    )
    return torch.cat([last, getattr(out, field)], dim=1)
