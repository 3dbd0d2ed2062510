"""Preference pairs for language-model DPO: a JSONL file read whole, checked line by line, each
answer rendered with the chat template exactly as an SFT row is (``data/sft.py``).

A pair is ``{"prompt": str, "chosen": A, "rejected": A}`` or ``{"messages": [...], "tools":
[...], "chosen": A, "rejected": A}``, where an answer ``A`` is a string or an assistant message
(``{"role": "assistant", "content": ..., "tool_calls": [...]}``). Each answer is appended to the
prompt's messages and the conversation rendered and checked by the SFT reader (roles, tool-call
JSON, prefix stability); the log-prob sum of DPO covers the answer's turn only (the last span
the rendering marks), so earlier assistant turns of ``messages`` are context. A bad pair is one
line naming ``file:line``; nothing trains until every pair of the file has been read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.data.sft import (
    SFTDataError,
    SFTRow,
    _messages,
    collate,
    render_checked,
)
from posttrain.data.tasks.jsonl import jsonl_objects
from posttrain.data.trajectory import TrajectoryBatch

#: The ``[B]`` bool column that marks a batch's chosen rows (the others are rejected).
CHOSEN_COLUMN = "lmdpo_chosen"


@dataclass(frozen=True)
class PairData:
    """Every pair of a file, rendered: ``(chosen, rejected)`` rows; ``dropped``: pairs left out
    by ``lmdpo.truncation=drop``."""

    pairs: list[tuple[SFTRow, SFTRow]]
    dropped: int


def _answer(value: Any, where: str) -> dict:
    if isinstance(value, str):
        return {"role": "assistant", "content": value}
    if isinstance(value, dict) and value.get("role", "assistant") == "assistant":
        return {**value, "role": "assistant"}
    raise SFTDataError(
        f"{where} must be a string or an assistant message "
        '({"role": "assistant", "content": ...})'
    )


def _prompt(row: dict, where: str) -> tuple[list[dict], list[dict]]:
    if isinstance(row.get("prompt"), str) and "messages" not in row:
        return [{"role": "user", "content": row["prompt"]}], []
    if isinstance(row.get("messages"), list):
        return row["messages"], row.get("tools") or []
    raise SFTDataError(
        f'{where}: a pair needs "prompt" (a string) or "messages" (a list), and "chosen" and '
        f'"rejected"; it has keys {sorted(row)}'
    )


def last_turn_only(mask: list[bool]) -> list[bool]:
    """The mask of the last run of trained tokens (the answer's turn) alone."""
    end = len(mask) - mask[::-1].index(True)
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return [start <= i < end for i in range(len(mask))]


def load_pairs(path: str, tokenizer: Any, max_tokens: int, truncation: str) -> PairData:
    """Read, check and render every pair of ``path`` (``lmdpo.max_tokens``,
    ``lmdpo.truncation``); raises :class:`SFTDataError` naming the first bad ``file:line``."""
    pairs: list[tuple[SFTRow, SFTRow]] = []
    dropped = 0
    for where, row in jsonl_objects(Path(path), SFTDataError):  # UTF-8, JSON, an object
        if "chosen" not in row or "rejected" not in row:
            keys = sorted(row)
            raise SFTDataError(f'{where}: a pair needs "chosen" and "rejected"; it has {keys}')
        prompt, tools = _prompt(row, where)
        rendered = []
        for side in ("chosen", "rejected"):
            answer = _answer(row[side], f'{where}: "{side}"')
            messages, tools_ = _messages({"messages": [*prompt, answer], "tools": tools}, where)
            ids, mask, _ = render_checked(tokenizer, messages, tools_, f'{where} ("{side}")')
            mask = last_turn_only(mask)
            if not any(mask[1:]):
                raise SFTDataError(f'{where}: "{side}" renders to no token after the first')
            rendered.append((ids, mask, side))
        over = [(side, len(ids)) for ids, _, side in rendered if len(ids) > max_tokens]
        if over:
            if truncation == "drop":
                dropped += 1
                continue
            side, n = over[0]
            raise SFTDataError(
                f'{where}: "{side}" renders to {n} tokens, over lmdpo.max_tokens={max_tokens}; '
                "raise it, or set lmdpo.truncation=drop"
            )
        chosen, rejected = (SFTRow(ids, mask, where) for ids, mask, _ in rendered)
        pairs.append((chosen, rejected))
    if not pairs:
        raise SFTDataError(f"{path}: no pair to train on ({dropped} dropped by lmdpo.truncation)")
    return PairData(pairs, dropped)


def collate_pairs(pairs: Sequence[tuple[SFTRow, SFTRow]], pad_id: int) -> TrajectoryBatch:
    """The pairs as one :class:`TrajectoryBatch`, chosen then rejected per pair (rows ``2k``,
    ``2k+1``), laid out as SFT rows are (their common prefix the prompt, the rest the response, the
    answer's tokens the loss mask); each pair is one group, so the trainer keeps it in one
    micro-batch, and :data:`CHOSEN_COLUMN` says which row is which."""
    rows = [r for pair in pairs for r in pair]
    group = torch.arange(len(pairs), dtype=torch.long).repeat_interleave(2)
    chosen = torch.arange(len(rows)) % 2 == 0
    return collate(rows, pad_id).replace(group_ids=group, columns={CHOSEN_COLUMN: chosen})
