"""One decode step of a Llama-family model over static KV buffers, shaped for CUDA graphs.

HF's decode forward rebuilds masks, grows caches and checks shapes on the host every token,
which on a GPU leaves the device idle between ~1,000 small kernel launches. This step reads only
fixed-shape device tensors: the new token per row, its position, the cache slot it writes, and a
validity mask over the slots. Nothing in it depends on host values, so the same step can be
captured once per (rows, context bucket) and replayed. Attention covers the first ``context``
slots only (a bucket: the filled slots rounded up), so short contexts do not pay for the whole
buffer.

The step reuses the model's own modules (projections, norms, MLP, rotary embedding): only the
attention over the buffers is written here. Supported: Llama-architecture decoders (Llama,
Mistral without sliding window, Qwen2, SmolLM); anything else is refused at construction.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

_LAYER_PARTS = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "scaling", "head_dim")


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot run :class:`StaticDecoder` (None when it can)."""
    inner = getattr(model, "model", None)
    for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, part):
            return f"{type(model).__name__} has no model.{part} (not a Llama-family decoder)"
    config = model.config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention is not supported by the static decode step"
    for layer in inner.layers:
        missing = [p for p in _LAYER_PARTS if not hasattr(layer, p)]
        missing += [p for p in _ATTN_PARTS if not hasattr(getattr(layer, "self_attn", None), p)]
        if missing:
            return f"decoder layer lacks {missing} (not a Llama-family layer)"
        if hasattr(layer.self_attn, "q_norm") or hasattr(layer.self_attn, "k_norm"):
            return "query/key norms (Qwen3-style) are not supported by the static decode step"
    if model.get_output_embeddings() is None:
        return "the model has no output embeddings"
    return None


class StaticDecoder:
    """KV buffers for ``rows`` rows of up to ``capacity`` slots, and the step that fills them."""

    def __init__(self, model: nn.Module, rows: int, capacity: int, dtype: torch.dtype) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"static decode engine: {reason}")
        self.model = model
        self.inner = model.model
        self.head = model.get_output_embeddings()
        attn = self.inner.layers[0].self_attn
        kv_heads = attn.k_proj.out_features // attn.head_dim
        device = next(model.parameters()).device
        shape = (rows, kv_heads, capacity, attn.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.inner.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.inner.layers]
        self.valid = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
        self.capacity = capacity

    def load_prefix(self, cache, mask: Tensor, rows_of: Tensor) -> None:
        """Copy a prefilled HF cache (``[k, H, P, D]`` per layer) into slots ``0..P-1``: buffer
        row ``j`` gets prompt ``rows_of[j]``'s; ``mask`` ``[k, P]`` marks real prompt tokens."""
        p = mask.shape[1]
        for i, layer in enumerate(cache.layers):
            self.keys[i][:, :, :p] = layer.keys[rows_of]
            self.values[i][:, :, :p] = layer.values[rows_of]
        self.valid.zero_()
        self.valid[:, :p] = mask.bool()[rows_of]

    @torch.no_grad()
    def step(self, tokens: Tensor, positions: Tensor, slot: Tensor, context: int) -> Tensor:
        """Logits ``[rows, V]`` for ``tokens`` ``[rows]`` at ``positions`` ``[rows]``, written
        into cache slot ``slot`` (a 1-element long tensor); attends over slots ``< context``."""
        self.valid.index_fill_(1, slot, True)
        h = self.inner.embed_tokens(tokens[:, None])
        cos, sin = self.inner.rotary_emb(h, positions[:, None])
        valid = self.valid[:, None, None, :context]
        for layer, keys, values in zip(self.inner.layers, self.keys, self.values, strict=True):
            h = h + self._attend(layer.self_attn, layer.input_layernorm(h), keys, values, slot,
                                 cos, sin, valid, context)  # fmt: skip
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.head(self.inner.norm(h))[:, 0]

    @staticmethod
    def _attend(attn, x, keys, values, slot, cos, sin, valid, context) -> Tensor:
        b, d = x.shape[0], attn.head_dim
        q = attn.q_proj(x).view(b, 1, -1, d).transpose(1, 2)
        k = attn.k_proj(x).view(b, 1, -1, d).transpose(1, 2)
        v = attn.v_proj(x).view(b, 1, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys.index_copy_(2, slot, k.to(keys.dtype))
        values.index_copy_(2, slot, v.to(values.dtype))
        # Grouped-query attention without copying the cache: query heads h*g .. h*g+g-1 share
        # key/value head h, so the g queries of a group form the rows of one matmul.
        kv_heads = keys.shape[1]
        q = q.reshape(b, kv_heads, -1, d)
        scores = q @ keys[:, :, :context].transpose(-1, -2)
        if scores.dtype in (torch.float16, torch.bfloat16):
            scores = scores.float()  # softmax in float32 for half weights, as HF's eager path
        scores = scores * attn.scaling
        probs = scores.masked_fill(~valid, float("-inf")).softmax(-1).to(values.dtype)
        out = probs @ values[:, :, :context]  # [b, kv_heads, g, d]
        return attn.o_proj(out.reshape(b, 1, -1))
