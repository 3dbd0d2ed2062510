"""Per-token logprobs of response tokens under a causal LM."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from posttrain.data.trajectory import TrajectoryBatch


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, so a padded prompt scores like an unpadded one."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``targets``.

    Computed as ``logit[y] - logsumexp(logits)`` so the full-vocabulary log-softmax is never
    materialised; only one scaled copy of the logits lives at a time.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


#: Above this many logit elements (rows x response tokens x vocabulary) per forward, log-probs
#: are computed in row chunks whose logits are recomputed in the backward instead of stored.
LOGIT_CHUNK_ELEMENTS = 1 << 26

#: Config attributes that make an HF head more than ``lm_head(hidden)`` (soft-capping, scaling).
_HEAD_MODIFIERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _forward_kwargs(batch: TrajectoryBatch) -> dict:
    return dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids_from_mask(batch.attention_mask),
        use_cache=False,
    )


def response_logits(model: nn.Module, batch: TrajectoryBatch) -> Tensor:
    """``[B, R, V]`` logits that predict each response token (row ``t`` predicts token ``t``).

    Asks the model for the last ``R + 1`` logit rows only (``logits_to_keep``): the row before
    the first response token through the last response token.
    """
    r = batch.response_width
    out = model(**_forward_kwargs(batch), logits_to_keep=r + 1)
    return out.logits[:, -(r + 1) : -1, :]


def response_logprobs(
    model: nn.Module,
    batch: TrajectoryBatch,
    temperature: float = 1.0,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
) -> Tensor:
    """``[B, R]`` logprobs of each response token given everything before it.

    When the response logits would exceed ``chunk_elements`` and the model's head is a plain
    linear layer, the decoder runs once and the head + log-softmax run per chunk of rows under
    activation checkpointing: the full-vocab logits (and their float32 copy) never exist for the
    whole batch at once.
    """
    r = batch.response_width
    head = _plain_head(model)
    per_row = max(1, r * head.out_features) if head is not None else 0
    rows = max(1, chunk_elements // per_row) if per_row else batch.batch_size
    if rows >= batch.batch_size:
        return token_logprobs(response_logits(model, batch), batch.response_ids, temperature)
    hidden = model.get_decoder()(**_forward_kwargs(batch)).last_hidden_state
    hidden = hidden[:, -(r + 1) : -1, :]
    targets = batch.response_ids
    out = []
    for s in range(0, batch.batch_size, rows):
        args = (hidden[s : s + rows], head.weight, head.bias, targets[s : s + rows], temperature)
        if torch.is_grad_enabled():
            out.append(checkpoint(_head_logprobs, *args, use_reentrant=False))
        else:
            out.append(_head_logprobs(*args))
    return torch.cat(out)


def _head_logprobs(hidden, weight, bias, targets, temperature) -> Tensor:
    return token_logprobs(F.linear(hidden, weight, bias), targets, temperature)


def _plain_head(model: nn.Module) -> nn.Linear | None:
    """The output layer when logits are exactly ``head(decoder(x).last_hidden_state)``."""
    get_head, get_decoder = (
        getattr(model, n, None) for n in ("get_output_embeddings", "get_decoder")
    )
    if get_head is None or get_decoder is None or hasattr(model, "_orig_mod"):
        return None  # a torch.compile wrapper owns the whole forward; don't bypass it
    config = getattr(model, "config", None)
    if any(getattr(config, a, None) not in (None, 1, 1.0) for a in _HEAD_MODIFIERS):
        return None
    head = get_head()
    return head if type(head) is nn.Linear else None
