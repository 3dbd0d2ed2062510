"""Keep whole groups of a rollout, and join rollouts of several sampling rounds into one.

Rounds differ in prompt width P and response width R, so joining re-pads: prompts on the left
(attention 0, which the position ids skip, so logprobs are unchanged) and responses on the right
(loss mask False, logprob 0). The pad token id is never attended to; 0 is valid in any vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from posttrain.data.trajectory import TrajectoryBatch
from posttrain.rollout.base import Rollout


def keep_groups(rollout: Rollout, groups: Tensor) -> Rollout:
    """The rows of the prompts ``groups`` (``[G]`` bool, one per prompt), in order."""
    if groups.shape != (rollout.batch.batch_size // rollout.n,) or groups.dtype != torch.bool:
        raise ValueError(f"groups must be bool [{rollout.batch.batch_size // rollout.n}]")
    rows = groups.repeat_interleave(rollout.n)
    texts = None
    if rollout.texts is not None:
        texts = tuple(t for t, k in zip(rollout.texts, rows.tolist(), strict=True) if k)
    return Rollout(rollout.batch[rows], rollout.truncated[rows], texts, rollout.n)


def _pad(t: Tensor, left: int, right: int, value) -> Tensor:
    return F.pad(t, (left, right), value=value) if left or right else t


def _pad_tokens(t: Tensor, right: int) -> Tensor:
    """Pad dim 1 (the response position) of a ``[B, R, ...]`` annotation on the right with 0."""
    return F.pad(t, [0, 0] * (t.dim() - 2) + [0, right]) if right else t


#: Fields laid out by position in the prompt+response sequence, re-padded explicitly below.
_SEQUENCE = ("input_ids", "attention_mask", "response_mask")


def _repad(b: TrajectoryBatch, p: int, r: int) -> TrajectoryBatch:
    lp, rr = p - b.prompt_width, r - b.response_width
    prompt, resp = b.input_ids[:, : b.prompt_width], b.response_ids
    attn_p, attn_r = b.attention_mask[:, : b.prompt_width], b.attention_mask[:, b.prompt_width :]
    # Every other [B, R, ...] annotation (logprobs, per-token advantages, teacher top-k).
    per_token = {
        f.name: _pad_tokens(value, rr)
        for f in dataclasses.fields(b)
        if f.name not in (*_SEQUENCE, "columns")
        and (value := getattr(b, f.name)) is not None
        and value.dim() >= 2
    }
    columns = {k: _pad_tokens(v, rr) if v.dim() >= 2 else v for k, v in b.columns.items()}
    return b.replace(
        input_ids=torch.cat([_pad(prompt, lp, 0, 0), _pad(resp, 0, rr, 0)], 1),
        attention_mask=torch.cat([_pad(attn_p, lp, 0, 0), _pad(attn_r, 0, rr, 0)], 1),
        response_mask=_pad(b.response_mask, 0, rr, False),
        columns=columns,
        **per_token,
    )


def concat_rollouts(parts: Sequence[Rollout]) -> Rollout:
    """One rollout with the rows of ``parts`` in order (all sampled with the same ``n``)."""
    if not parts:
        raise ValueError("concat_rollouts needs at least one rollout")
    n = parts[0].n
    if any(x.n != n for x in parts):
        raise ValueError("concat_rollouts: every part must have the same n")
    p = max(x.batch.prompt_width for x in parts)
    r = max(x.batch.response_width for x in parts)
    batches = [_repad(x.batch, p, r) for x in parts]
    fields = {}
    names = {tuple(sorted(b.columns)) for b in batches}
    if len(names) > 1:
        raise ValueError(f"concat_rollouts: the parts carry different columns {sorted(names)}")
    fields["columns"] = {k: torch.cat([b.columns[k] for b in batches], 0) for k in names.pop()}
    for f in dataclasses.fields(TrajectoryBatch):
        if f.name == "columns":
            continue
        values = [getattr(b, f.name) for b in batches]
        if any(v is None for v in values):
            if any(v is not None for v in values):
                raise ValueError(f"concat_rollouts: {f.name} is set in some parts only")
            fields[f.name] = None
        else:
            fields[f.name] = torch.cat(values, 0)
    texts = None
    if all(x.texts is not None for x in parts):
        texts = tuple(t for x in parts for t in x.texts)  # type: ignore[union-attr]
    truncated = torch.cat([x.truncated for x in parts], 0)
    return Rollout(TrajectoryBatch(**fields), truncated, texts, n)
