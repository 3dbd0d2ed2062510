"""SFT rows: a JSONL file read whole, checked line by line, rendered to ids and a loss mask.

A row is ``{"messages": [...], "tools": [...]}`` (OpenAI style: roles system, user, assistant
with optional ``tool_calls``, tool) or ``{"prompt": ..., "completion": ...}`` (one user turn and
one assistant turn). A bad row is one line naming ``file:line`` and the fix, and nothing trains
until every row of the file has been read, checked and rendered.

**The loss mask comes from the rendering**, by the prefix-stability rule of multi-turn RL
(``env/render.py``): for each assistant turn ``i`` the template's text of the conversation up to
it with the generation prompt, ``P_i``, must extend the text covered so far, and the text with
the turn, ``C_i``, must start with ``P_i``; the turn's span is ``C_i[len(P_i):]`` up to and
including the template's stop token (the tokenizer's EOS; a template whose turn holds none is
refused), and what lies between spans is context. Each piece is encoded alone (``render.encode``), as a rollout's prompt and sampled ids
are, so the trained ids are those the model samples after that prompt. A row whose earlier
turns the template rewrites trains on its last assistant turn only (one warning names the first
such row; the rows it renders prefix-stably train on every turn); a tokenizer
without a chat template renders prompt/completion rows as ``BOS + prompt`` then
``completion + EOS`` (one warning) and refuses message rows.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.config.errors import ConfigError
from posttrain.data.tasks.jsonl import jsonl_objects
from posttrain.data.trajectory import DOCUMENT_POSITIONS, TrajectoryBatch
from posttrain.env.render import TemplateError, encode, first_difference, render

log = logging.getLogger("posttrain")

ROLES = ("system", "user", "assistant", "tool")


class SFTDataError(ConfigError):
    """A row of an SFT file that cannot be trained on; one line naming ``file:line``."""


@dataclass(frozen=True)
class SFTRow:
    """One rendered row: its ids, which of them carry loss, and where it came from."""

    ids: list[int]
    mask: list[bool]
    where: str


@dataclass(frozen=True)
class SFTData:
    """Every row of a file, rendered; ``dropped``: rows left out by ``sft.truncation``."""

    rows: list[SFTRow]
    dropped: int
    fallback: str | None


def _messages(row: dict, where: str) -> tuple[list[dict], list[dict]]:
    """The row's messages (checked, tool-call arguments parsed) and tools."""
    if "messages" in row:
        messages, tools = row["messages"], row.get("tools") or []
    elif isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
        messages = [{"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["completion"]}]  # fmt: skip
        tools = []
    else:
        raise SFTDataError(
            f'{where}: a row needs "messages" (a list) or "prompt" and "completion" '
            f"(strings); it has keys {sorted(row)}"
        )
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise SFTDataError(f'{where}: "messages" must be a list of objects')
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise SFTDataError(f'{where}: "tools" must be a list of objects (function schemas)')
    out = []
    for k, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            raise SFTDataError(
                f"{where}: message {k} has role {role!r}, which the chat template does not "
                f"know; use one of {', '.join(ROLES)}"
            )
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise SFTDataError(f"{where}: message {k} content must be a string or null")
        weight = m.get("weight", 1)  # OpenAI's fine-tuning key: 0 makes the turn context
        if (
            (role != "assistant" and "weight" in m)
            or type(weight) is not int
            or weight not in (0, 1)
        ):
            raise SFTDataError(
                f'{where}: message {k} has "weight" {weight!r}; only an assistant turn takes '
                "one, 0 (context) or 1 (trained, the default)"
            )
        msg = {**m, "content": content or ""}
        if "tool_calls" in m:
            msg["tool_calls"] = [_tool_call(c, f"{where}: message {k} tool call {j}")
                                 for j, c in enumerate(m["tool_calls"] or [])]  # fmt: skip
        out.append(msg)
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in out):
        raise SFTDataError(
            f"{where}: no assistant turn of weight 1 (nothing to train on); add one or remove "
            "the row"
        )
    return out, tools


def _tool_call(call: Any, where: str) -> dict:
    """An OpenAI tool call with its ``arguments`` parsed (templates render them as JSON)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise SFTDataError(f'{where} needs {{"function": {{"name": ..., "arguments": ...}}}}')
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise SFTDataError(
                f"{where}: arguments are not valid JSON ({e.msg} at character {e.pos}); write "
                "them as a JSON object or a string holding one"
            ) from None
    if not isinstance(args, dict):
        raise SFTDataError(f"{where}: arguments must be a JSON object")
    return {**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}}


def _spans(tokenizer: Any, messages: list[dict], tools: list[dict], stop: str, last_only: bool):
    """``[(text, trained)]`` pieces of the conversation up to its last assistant turn, or None
    when the template is not prefix-stable for it (see the module rule)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("weight", 1)]
    if last_only:
        turns = turns[-1:]
    # a turn of weight 0 is context; the key is the row's, never the template's
    messages = [{k: v for k, v in m.items() if k != "weight"} for m in messages[: turns[-1] + 1]]
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i in turns:
        prompt = render(tokenizer, messages[:i], tools, generation_prompt=True)
        closed = render(tokenizer, messages[: i + 1], tools)
        if not prompt.startswith(done):
            return None, first_difference(prompt, done)
        if not closed.startswith(prompt):
            return None, first_difference(closed, prompt)
        span = closed[len(prompt) :]
        if stop:  # the turn ends at the stop token a rollout stops at
            cut = span.find(stop)
            if cut < 0:
                raise TemplateError(
                    f"the chat template closes an assistant turn without the tokenizer's EOS "
                    f"{stop!r} (the turn ends {span[-20:]!r}), so the model would not learn to "
                    "stop; use a tokenizer whose eos_token ends the template's assistant turns "
                    "(model.tokenizer_path)"
                )
            span = span[: cut + len(stop)]
        for call in messages[i].get("tool_calls", []):
            if call["function"]["name"] not in span:
                raise TemplateError(
                    f"the chat template does not render assistant tool_calls (the call to "
                    f"{call['function']['name']!r} is not in the turn's text); use a template "
                    "that does, or write the call into the assistant content"
                )
        pieces += [(prompt[len(done) :], False), (span, True)]
        done = prompt + span
    return pieces, ""


def render_row(tokenizer: Any, messages: list[dict], tools: list[dict]) -> tuple[list, list, bool]:
    """``(ids, mask, last_only)`` of a checked row (``last_only``: the fallback was taken)."""
    if getattr(tokenizer, "chat_template", None) is None:
        if len(messages) != 2 or [m["role"] for m in messages] != ["user", "assistant"]:
            raise TemplateError(
                "the tokenizer has no chat template, so only prompt/completion rows render; "
                "set model.tokenizer_path to a tokenizer with one"
            )
        pieces = [((tokenizer.bos_token or "") + messages[0]["content"], False),
                  (messages[1]["content"] + (tokenizer.eos_token or ""), True)]  # fmt: skip
        last_only = False
    else:
        stop = tokenizer.eos_token or ""
        pieces, why = _spans(tokenizer, messages, tools, stop, last_only=False)
        last_only = pieces is None
        if last_only:
            pieces, why = _spans(tokenizer, messages, tools, stop, last_only=True)
            if pieces is None:
                raise TemplateError(
                    f"the chat template does not render an assistant turn as its generation "
                    f"prompt followed by the turn ({why}); its spans cannot be marked"
                )
    ids: list[int] = []
    mask: list[bool] = []
    for text, trained in pieces:
        piece = encode(tokenizer, text)
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask, last_only


def render_checked(tokenizer: Any, messages: list[dict], tools: list[dict], where: str):
    """:func:`render_row`, with a template's refusal as one line naming ``where``."""
    try:
        return render_row(tokenizer, messages, tools)
    except TemplateError as e:
        raise SFTDataError(f"{where}: {e}") from None
    except Exception as e:  # the template's own refusal (jinja raise_exception, a bad key)
        raise SFTDataError(
            f"{where}: the chat template cannot render this row ({type(e).__name__}: {e})"
        ) from None


def load_sft(path: str, tokenizer: Any, max_tokens: int, truncation: str) -> SFTData:
    """Read, check and render every row of ``path`` (``sft.max_tokens``, ``sft.truncation``);
    raises :class:`SFTDataError` naming the first bad ``file:line``."""
    rows: list[SFTRow] = []
    dropped, fallback = 0, None
    for where, row in jsonl_objects(Path(path), SFTDataError):  # UTF-8, JSON, an object
        messages, tools = _messages(row, where)
        ids, mask, last_only = render_checked(tokenizer, messages, tools, where)
        if last_only and fallback is None:
            fallback = (
                f"{where}: the chat template rewrites earlier turns when later ones follow, so "
                "their assistant spans cannot be marked; this row and every other such row "
                "train on their last assistant turn only"
            )
        if len(ids) > max_tokens:
            if truncation == "error":
                raise SFTDataError(
                    f"{where}: the row renders to {len(ids)} tokens, over sft.max_tokens="
                    f"{max_tokens}; raise it, or set sft.truncation=drop or truncate"
                )
            if truncation == "drop" or not any(mask[:max_tokens]):
                dropped += 1
                continue
            ids, mask = ids[:max_tokens], mask[:max_tokens]
        if not any(mask[1:]):
            raise SFTDataError(f"{where}: the assistant turn renders to no token after the first")
        rows.append(SFTRow(ids, mask, where))
    if not rows:
        raise SFTDataError(f"{path}: no row to train on ({dropped} dropped by sft.truncation)")
    if fallback is None and getattr(tokenizer, "chat_template", None) is None:
        fallback = (
            f"{path}: the tokenizer has no chat template; prompt/completion rows are rendered as "
            "BOS + prompt, then completion + EOS (trained)"
        )
    return SFTData(rows, dropped, fallback)


def common_prefix(rows: Sequence[SFTRow]) -> int:
    """How many leading tokens every row shares before any row's first trained token (>= 1).

    Rows with one system prompt and tool schemas share hundreds of tokens; laid out as the
    batch's prompt, a shared-prefix forward (``data/prefix.py``) encodes them once for all rows
    instead of once per row, exactly (every row's later tokens attend to the same keys)."""
    limit = min(min(r.mask.index(True) for r in rows), min(len(r.ids) for r in rows) - 1)
    first = rows[0].ids
    n = 1
    while n < limit and all(r.ids[n] == first[n] for r in rows):
        n += 1
    return n


def collate(rows: Sequence[SFTRow], pad_id: int) -> TrajectoryBatch:
    """The rows as a :class:`TrajectoryBatch`: their :func:`common_prefix` is the prompt, the
    rest of each row its response (right-padded), the loss mask its trained tokens among them;
    every row is its own group."""
    p = common_prefix(rows)
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss = torch.zeros((len(rows), width - p), dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r.ids)] = torch.tensor(r.ids)
        attention[b, : len(r.ids)] = 1
        loss[b, : len(r.ids) - p] = torch.tensor(r.mask[p:])
    index = torch.arange(len(rows), dtype=torch.long)
    return TrajectoryBatch(ids, attention, loss, group_ids=index, sample_ids=index.clone())


def pack(rows: Sequence[SFTRow], max_tokens: int, min_bins: int = 1) -> list[list[int]]:
    """Row indices per packed sequence of at most ``max_tokens`` tokens: first fit, longest
    rows first (ties by index), so the packing is a function of the rows alone. At least
    ``min_bins`` sequences (one per policy rank, so that each rank gets one; at most
    ``len(rows)``): while there are fewer, the bin with the most rows (the first of those)
    gives its last row a bin of its own."""
    if not 1 <= min_bins <= len(rows):
        raise ValueError(f"cannot pack {len(rows)} rows into at least {min_bins} sequences")
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i].ids), i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(rows[i].ids)
        k = next((k for k, free in enumerate(room) if free >= n), None)
        if k is None:
            bins.append([i])
            room.append(max_tokens - n)
        else:
            bins[k].append(i)
            room[k] -= n
    while len(bins) < min_bins:
        k = max(range(len(bins)), key=lambda k: (len(bins[k]), -k))
        bins.append([bins[k].pop()])
    return bins


def collate_packed(rows: Sequence[SFTRow], bins: Sequence[Sequence[int]], pad_id: int):
    """The rows concatenated per bin (:func:`pack`) as one batch row each, with their
    :data:`DOCUMENT_POSITIONS`: every document attends to itself only, and its first token,
    which the previous document would predict, carries no loss."""
    width = max(sum(len(rows[i].ids) for i in b) for b in bins)
    shape = (len(bins), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    trained = torch.zeros(shape, dtype=torch.bool)
    positions = torch.zeros(shape, dtype=torch.long)
    for b, members in enumerate(bins):
        at = 0
        for i in members:
            r, n = rows[i], len(rows[i].ids)
            ids[b, at : at + n] = torch.tensor(r.ids)
            attention[b, at : at + n] = 1
            trained[b, at + 1 : at + n] = torch.tensor(r.mask[1:], dtype=torch.bool)
            positions[b, at : at + n] = torch.arange(n)
            at += n
        positions[b, at:] = torch.arange(width - at)  # the padding: a document of its own
    index = torch.arange(len(bins), dtype=torch.long)
    return TrajectoryBatch(ids, attention, trained[:, 1:], group_ids=index,
                           sample_ids=index.clone(),
                           columns={DOCUMENT_POSITIONS: positions[:, 1:]})  # fmt: skip
