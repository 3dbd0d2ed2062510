"""Multi-turn sampling that continues every trajectory from its KV cache.

One :class:`TurnSession` holds a batched cache whose row ``i`` is one trajectory. A turn
prefills only what was appended since the trajectory's last turn (the prompt first, then the
last sampled token and one observation segment), then decodes. Rows differ in how much they
append and in when they stop, so the cache has holes: every column a row did not fill (left
padding of a block, decode steps after the row stopped) has attention mask 0, and position ids
count only the filled columns. The logits of each real token are therefore those of the
trajectory's plain full-sequence forward (to rounding), whatever the batching.

The last token sampled in a turn is never fed during that turn (its row stops there); it leads
the row's next block. Trajectories left out of a turn's requests have ended and are dropped
from the cache; a request list whose every request is a first turn opens a new session.

Sliding-window layers count a window in tokens, and the trainer's forward over a trajectory has
no holes, so a window over cache *columns* would show a row fewer of its own tokens than the
trainer sees. For a model with such layers the session keeps every column (a plain cache) and
passes the model explicit masks built from the tokens' positions (:func:`window_masks`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from posttrain.data.prefix import position_ids_from_mask
from posttrain.env.episode import TurnRequest
from posttrain.rollout.sampling import check_sampling_args, sample_tokens


def attention_windows(config) -> dict[str, int | None] | None:
    """The window of each kind of attention layer, None when no layer has one.

    ``{"all": w}`` for a model whose every layer slides (Mistral: one mask for all layers);
    ``{kind: w or None}`` for one that names its layers' kinds (Qwen2, Gemma: a mask per kind).
    """
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        return {"all": int(window)}
    if "sliding_attention" not in kinds:
        return None
    return {k: int(window) if k == "sliding_attention" else None for k in dict.fromkeys(kinds)}


def window_masks(mask: Tensor, queries: int, windows: dict[str, int | None], dtype):
    """Additive ``[rows, 1, queries, columns]`` masks for the last ``queries`` columns of a
    cache with holes: a key is seen when it is filled, not later than the query, and (for a
    window ``w``) fewer than ``w`` tokens before it, counting filled columns only."""
    cols = mask.shape[1]
    pos = mask.long().cumsum(-1)  # the token count up to each column
    arange = torch.arange(cols, device=mask.device)
    causal = arange[None, :] <= arange[cols - queries :, None]  # [queries, columns]
    seen = mask.bool()[:, None, :] & causal[None]
    lag = pos[:, cols - queries :, None] - pos[:, None, :]
    low = torch.finfo(dtype).min

    def additive(window: int | None) -> Tensor:
        ok = seen if window is None else seen & (lag < window)
        return torch.zeros(ok.shape, dtype=dtype, device=mask.device).masked_fill(~ok, low)[:, None]

    if "all" in windows:
        return additive(windows["all"])
    return {kind: additive(w) for kind, w in windows.items()}


class TurnSession:
    """The cache and random stream of one multi-turn rollout, for an engine's ``forward``.

    ``forward(ids, mask, positions, cache)`` returns the last column's logits ``[B, V]``;
    ``model`` is the module it runs (its config and dtype shape the cache and masks).
    """

    def __init__(
        self,
        forward: Callable[[Tensor, Tensor, Tensor, DynamicCache], Tensor],
        model: nn.Module,
        pad_token_id: int,
        stop_token_ids: Sequence[int],
        temperature: float,
        top_p: float,
        seed: int,
    ) -> None:
        check_sampling_args(temperature, top_p)
        self.forward, self.temperature, self.top_p = forward, temperature, top_p
        self.config = model.config
        self.device = next(model.parameters()).device
        self.pad_token_id, self.stop_token_ids = pad_token_id, tuple(stop_token_ids)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.cache: DynamicCache | None = None
        self.keys: list[int] = []  # key of each cache row
        self.mask: Tensor | None = None  # [rows, columns] attention mask of the cache
        self.next_pos: Tensor | None = None  # [rows] position of each row's next token
        self.pending: dict[int, int] = {}  # key -> its last sampled token, not yet in the cache
        self.windows = attention_windows(model.config)
        self.dtype = next(model.parameters()).dtype

    def _forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        """The engine's forward of ``ids`` (the cache's last columns) under ``self.mask``."""
        mask = self.mask
        if self.windows is not None:
            mask = window_masks(mask, ids.shape[1], self.windows, self.dtype)
        return self.forward(ids, mask, positions, self.cache)

    def _blocks(self, requests: Sequence[TurnRequest]) -> tuple[Tensor, Tensor]:
        dev, pad = self.device, self.pad_token_id
        blocks = []
        for r in requests:
            head = [self.pending[r.key]] if r.key in self.pending else []
            blocks.append(head + [int(t) for t in r.new_ids])
        w = max(len(b) for b in blocks)
        ids = torch.full((len(blocks), w), pad, dtype=torch.long)
        mask = torch.zeros((len(blocks), w), dtype=torch.long)
        for i, b in enumerate(blocks):
            if not b:
                raise ValueError(f"turn request {requests[i].key} appends no ids")
            ids[i, w - len(b) :] = torch.as_tensor(b)
            mask[i, w - len(b) :] = 1
        return ids.to(dev), mask.to(dev)

    def _select(self, requests: Sequence[TurnRequest]) -> None:
        """Keep (and order) the cache rows of the requested trajectories; drop the rest."""
        first = [len(r.context) == len(r.new_ids) for r in requests]
        if all(first):
            self.cache, self.keys, self.mask, self.next_pos, self.pending = None, [], None, None, {}
            return
        if any(first):
            raise ValueError("a turn batch mixes first turns with continued trajectories")
        row = {k: i for i, k in enumerate(self.keys)}
        missing = [r.key for r in requests if r.key not in row]
        if missing:
            raise ValueError(f"turn requests continue trajectories {missing} this session lacks")
        idx = torch.as_tensor([row[r.key] for r in requests], device=self.device)
        if len(idx) != len(self.keys) or not bool(
            (idx == torch.arange(len(idx), device=idx.device)).all()
        ):
            self.cache.batch_select_indices(idx)
            self.mask, self.next_pos = self.mask[idx], self.next_pos[idx]
        self.keys = [r.key for r in requests]

    def turn(self, requests: Sequence[TurnRequest]) -> list[tuple[list[int], list[float]]]:
        """Sample one turn per request: its ids (ending at a stop id unless they fill
        ``max_new_tokens``) and the sampler's logprob of each."""
        if not requests:
            self.cache = self.mask = self.next_pos = None
            self.keys, self.pending = [], {}
            return []
        self._select(requests)
        ids, block = self._blocks(requests)
        if self.cache is None:  # first turns: each distinct prompt is prefilled once
            # a model's own cache drops columns past a sliding window; this one keeps them all
            self.cache = (
                DynamicCache(config=self.config) if self.windows is None else DynamicCache()
            )
            self.keys = [r.key for r in requests]
            index: dict[tuple[int, ...], int] = {}
            which = [index.setdefault(tuple(r.new_ids), len(index)) for r in requests]
            firsts = [which.index(g) for g in range(len(index))]
            ids, self.mask = ids[firsts], block[firsts]
            logits = self._forward(ids, position_ids_from_mask(self.mask))
            rows_of = torch.as_tensor(which, device=ids.device)
            if len(firsts) < len(requests):
                self.cache.batch_select_indices(rows_of)
            logits, self.mask = logits[rows_of], self.mask[rows_of]
            self.next_pos = self.mask.sum(-1)
        else:
            pos = self.next_pos[:, None] + (block.cumsum(-1) - 1).clamp(min=0)
            self.mask = torch.cat([self.mask, block], dim=1)
            self.next_pos = self.next_pos + block.sum(-1)
            logits = self._forward(ids, pos)
        budgets = torch.as_tensor([r.max_new_tokens for r in requests], device=ids.device)
        stop_ids = torch.as_tensor(self.stop_token_ids, dtype=torch.long, device=ids.device)
        rows = len(requests)
        done = torch.zeros(rows, dtype=torch.bool, device=ids.device)
        toks, lps = [], []
        for t in range(int(budgets.max())):
            tok, lp = sample_tokens(logits, self.temperature, self.top_p, self.generator)
            toks.append(torch.where(done, -1, tok))
            lps.append(lp)
            done = done | torch.isin(tok, stop_ids) | (budgets <= t + 1)
            if bool(done.all()):
                break
            col = (~done).long()
            self.mask = torch.cat([self.mask, col[:, None]], dim=1)
            fed = torch.where(done, self.pad_token_id, tok)
            logits = self._forward(fed[:, None], self.next_pos[:, None])
            self.next_pos = self.next_pos + col
        tok_rows = torch.stack(toks, 1).tolist()
        lp_rows = torch.stack(lps, 1).double().tolist()
        out = []
        for r, t_row, lp_row in zip(requests, tok_rows, lp_rows, strict=True):
            n = next((i for i, t in enumerate(t_row) if t < 0), len(t_row))
            self.pending[r.key] = t_row[n - 1]
            out.append((t_row[:n], lp_row[:n]))
        return out
