"""Padding a forward does not need: trimmed per micro-batch, and counted.

A collected batch is padded to its longest prompt (left) and longest response (right), so a
micro-batch sliced from it carries columns that are padding in every one of its rows. Those
columns are masked out of attention and predict nothing that is scored, so dropping them before
the forward changes nothing but rounding (shorter reductions), and it is what makes a
micro-batch of short rows cheap (``rl.micro_batch_tokens`` groups rows of similar length).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.data.trajectory import DOCUMENT_POSITIONS, TrajectoryBatch


def row_lengths(batch: TrajectoryBatch) -> tuple[list[int], list[int]]:
    """Each row's real prompt tokens and response extent (up to its last real or loss token)."""
    p = batch.prompt_width
    prompt = batch.attention_mask[:, :p].bool().sum(1)
    live = batch.attention_mask[:, p:].bool() | batch.response_mask
    cols = torch.arange(1, batch.response_width + 1, device=live.device)
    response = torch.where(live, cols, 0).amax(1)
    return prompt.tolist(), response.tolist()


def trimmed_width(prompt: Sequence[int], response: Sequence[int]) -> int:
    """Columns a micro-batch of these rows runs on after :func:`trim_padding` (at least one
    response column is kept, as every forward predicts one token)."""
    return max(prompt, default=0) + max(1, max(response, default=0))


def trim_padding(batch: TrajectoryBatch) -> TrajectoryBatch:
    """``batch`` without the leading prompt columns and trailing response columns that are
    padding in every row; only the fields a scoring forward reads are kept."""
    prompt, response = row_lengths(batch)
    p, r = batch.prompt_width, batch.response_width
    keep_p, keep_r = max(prompt, default=0), max(1, max(response, default=0))
    if keep_p == p and keep_r == r:
        return batch
    cols = slice(p - keep_p, p + keep_r)
    packed = batch.columns.get(DOCUMENT_POSITIONS)  # a forward reads it too
    return TrajectoryBatch(
        input_ids=batch.input_ids[:, cols],
        attention_mask=batch.attention_mask[:, cols],
        response_mask=batch.response_mask[:, :keep_r],
        group_ids=batch.group_ids,
        sample_ids=batch.sample_ids,
        columns={} if packed is None else {DOCUMENT_POSITIONS: packed[:, :keep_r]},
    )


def pad_responses(t: Tensor, width: int) -> Tensor:
    """``[B, R', ...]`` scores of a trimmed batch back to ``[B, width, ...]`` (zeros after R')."""
    extra = width - t.shape[1]
    if extra == 0:
        return t
    return F.pad(t, (0, 0) * (t.dim() - 2) + (0, extra))


def padding_counts(
    batch: TrajectoryBatch, chunks: Sequence[slice | Sequence[int]]
) -> tuple[int, int]:
    """``(real tokens, tokens forwarded)`` over ``chunks`` of ``batch``, each trimmed."""
    prompt, response = row_lengths(batch)
    real = forwarded = 0
    for c in chunks:
        rows = range(len(prompt))[c] if isinstance(c, slice) else list(c)
        p = [prompt[i] for i in rows]
        r = [response[i] for i in rows]
        real += sum(p) + sum(r)
        forwarded += len(rows) * trimmed_width(p, r)
    return real, forwarded
