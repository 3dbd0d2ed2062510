"""Per-token logprobs of response tokens under a causal LM."""

from __future__ import annotations

import torch
from torch import Tensor, nn

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


def response_logits(model: nn.Module, batch: TrajectoryBatch) -> Tensor:
    """``[B, R, V]`` logits that predict each response token (row ``t`` predicts token ``t``).

    Asks the model for the last ``R + 1`` logit rows only (``logits_to_keep``): the row before
    the first response token through the last response token.
    """
    r = batch.response_width
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids_from_mask(batch.attention_mask),
        use_cache=False,
        logits_to_keep=r + 1,
    )
    return out.logits[:, -(r + 1) : -1, :]


def response_logprobs(model: nn.Module, batch: TrajectoryBatch, temperature: float = 1.0) -> Tensor:
    """``[B, R]`` logprobs of each response token given everything before it."""
    return token_logprobs(response_logits(model, batch), batch.response_ids, temperature)
