"""A KV cache sized for the whole rollout, so a decode step writes one token in place.

transformers' ``DynamicLayer`` concatenates each new token onto the history, copying the whole
cache every step (quadratic in the response length; it dominated decode time for small models).
The rollout knows its final length (prompt width + ``max_tokens``) up front, so each full-attention
layer gets one buffer of that size and returns views of the filled prefix. Layers of any other kind
(sliding window, linear attention, ...) keep the model's own cache layer.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """Full-attention cache layer over a ``[B, H, capacity, D]`` buffer."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: Tensor | None = None
        self._v: Tensor | None = None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def _expose(self) -> tuple[Tensor, Tensor]:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]
        return self.keys, self.values

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded (needs {end})")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        return self._expose()

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        self.length = 0
        self._k = self._v = self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._expose()

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.is_initialized:
            self._k = self._k[indices]
            self._v = self._v[indices]
            self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))


def rollout_cache(config, capacity: int) -> DynamicCache:
    """The model's own dynamic cache, with its plain full-attention layers preallocated."""
    cache = DynamicCache(config=config)
    if not cache.layers:  # layer kinds unknown until the first forward: keep HF's lazy layers
        return cache
    cache.layers = [
        PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
        for layer in cache.layers
    ]
    return cache
