"""The built-in rollout engine: batched sampling on torch with the model's own KV cache.

Each chunk of prompts is prefilled once (one row per distinct prompt: a prompt listed twice is
prefilled once too), the cache is then copied to every sample row, and decoding runs one batched forward per generated token. Rows that hit a
stop token are dropped from the cache once they make up an eighth of it, so long-tailed lengths do
not keep paying for finished rows. Left padding is exact: every forward gets the attention mask and
explicit position ids that skip the padding, as ``data.logprobs.response_logprobs`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from posttrain.data.logprobs import position_ids_from_mask
from posttrain.env.episode import TurnRequest
from posttrain.rollout.base import (
    Rollout,
    assemble_rollout,
    check_generate_args,
    left_pad,
    stop_and_pad_ids,
)
from posttrain.rollout.capabilities import TORCH
from posttrain.rollout.continuation import TurnSession
from posttrain.rollout.kv_cache import rollout_cache
from posttrain.rollout.sampling import check_sampling_args, sample_tokens


def distinct_prompts(prompts: list[list[int]], n: int) -> tuple[list[list[int]], Tensor]:
    """The distinct prompts, in order of first appearance, and the one each of the
    ``len(prompts) * n`` sample rows reads (so a repeated prompt is prefilled once)."""
    index: dict[tuple[int, ...], int] = {}
    which = [index.setdefault(tuple(p), len(index)) for p in prompts]
    unique = [list(p) for p in index]
    return unique, torch.as_tensor(which, dtype=torch.long).repeat_interleave(n)


class ModuleWeights:
    """The weight receiver of an engine that samples with an ``nn.Module`` in this process:
    ``load`` copies each tensor into the parameter of that name in place (same storage, so
    captured CUDA graphs stay valid), with the ``copy_`` a ``load_state_dict`` runs."""

    def __init__(self, engine: TorchRolloutEngine) -> None:
        self._engine = engine

    def names(self) -> dict[str, str]:
        first: dict[tuple, str] = {}
        return {
            k: first.setdefault((v.data_ptr(), v.dtype, v.shape), k)
            for k, v in self._engine.model.state_dict().items()
            if v.numel()
        }

    def adapter_modules(self) -> None:
        """None: a plain module takes full weights (the sink merges a LoRA policy's adapters
        onto its base copy)."""
        return None

    def begin(self) -> None:
        """Nothing to prepare: the copies go straight into the sampling weights."""

    def load(self, weights: Mapping[str, Tensor]) -> None:
        targets = self._engine.model.state_dict()
        for name, value in weights.items():
            target = targets.get(name)
            if target is None or target.shape != value.shape:
                have = "no such weight" if target is None else f"shape {tuple(target.shape)}"
                raise ValueError(
                    f"sync_weights: {name!r} {tuple(value.shape)} does not fit the engine's "
                    f"model ({have}); send the policy's weights under the model's own names"
                )
        with torch.no_grad():
            for name, value in weights.items():
                targets[name].copy_(value)

    def end(self) -> int:
        self._engine.weight_version += 1
        return self._engine.weight_version


class TorchRolloutEngine:
    """Samples with an HF causal LM in this process (implements ``RolloutEngine``).

    ``model`` may be the policy module itself: then ``sync_weights(policy)`` copies nothing, since
    the engine already samples with the updated parameters. ``stop_token_ids`` default to the
    tokenizer's and the model's EOS ids; ``max_rows`` bounds the rows (prompts x n) decoded at
    once, to cap KV-cache memory (a chunk holds at least one prompt's ``n`` rows).

    Reproducibility: one random stream serves the whole call, so a sample depends on the seed,
    the prompts, the weights and ``max_rows`` (which fixes the chunking), not only on its own
    prompt.
    """

    capabilities = TORCH

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        *,
        stop_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        max_rows: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_ids, self.pad_token_id = stop_and_pad_ids(
            model, tokenizer, stop_token_ids, pad_token_id
        )
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.weight_version = 0
        # transformers 5 calls the cache keyword ``cache``; 4.x called it ``past_key_values``
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._turns: TurnSession | None = None  # the multi-turn rollout in progress
        self._receiver = ModuleWeights(self)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def shares(self, module: nn.Module) -> bool:
        return module is self.model

    def weight_receiver(self) -> ModuleWeights:
        return self._receiver

    def sync_weights(self, source: nn.Module | Mapping[str, Tensor], *, final: bool = True) -> None:
        """Take the policy's weights after an update: a module, or tensors by name (a
        convenience over :meth:`weight_receiver`).

        The engine's module is the policy module: nothing to copy. Another module is loaded
        with a strict ``load_state_dict``. A mapping may hold part of the weights (one bucket of
        a sync, or only the layers that changed), loaded by the receiver; ``final=False`` marks
        a bucket that more buckets of the same sync follow: the weight version moves on once,
        with the last.
        """
        if isinstance(source, nn.Module):
            if source is not self.model:
                self.model.load_state_dict(source.state_dict(), strict=True)
        else:
            self._receiver.load(source)
        if final:
            self._receiver.end()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        group_ids: Sequence[int] | None = None,
        group_id_offset: int = 0,
        sample_id_offset: int = 0,
    ) -> Rollout:
        """Sample ``n`` responses per prompt; see ``RolloutEngine.generate``.

        Randomness: ``generator`` if given, else a fresh one seeded with ``seed``, else torch's
        global generator. Logprobs follow ``rollout.sampling`` (top-p renormalised, greedy = 0).
        """
        prompts = self._check(
            prompts, n, temperature, top_p, max_tokens, group_ids, group_id_offset
        )
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        per_chunk = len(prompts) if self.max_rows is None else max(1, self.max_rows // n)
        toks, lps, lens, stopped = [], [], [], []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(prompts), per_chunk):
                    chunk = prompts[start : start + per_chunk]
                    out = self._generate_chunk(chunk, n, temperature, top_p, max_tokens, generator)
                    for lst, val in zip((toks, lps, lens, stopped), out, strict=True):
                        lst.append(val)
        finally:
            self.model.train(was_training)
        lengths = torch.cat(lens)
        r = int(lengths.max())
        return assemble_rollout(
            prompts, n, torch.cat([t[:, :r] for t in toks]), torch.cat([lp[:, :r] for lp in lps]),
            lengths, torch.cat(stopped), pad_token_id=self.pad_token_id, tokenizer=self.tokenizer,
            group_ids=group_ids, group_id_offset=group_id_offset,
            sample_id_offset=sample_id_offset,
        )  # fmt: skip

    def generate_turns(
        self, requests: Sequence[TurnRequest], *, temperature: float, top_p: float, seed: int
    ) -> list[tuple[list[int], list[float]]]:
        """One turn of a multi-turn rollout per request (``rollout.continuation``): each
        trajectory continues from its KV cache, prefilling only its new ids. Requests that are
        all first turns open a new session seeded with ``seed``; an empty list frees it
        (:meth:`end_turns`)."""
        if not requests:
            self.end_turns()
            return []
        first = all(len(r.context) == len(r.new_ids) for r in requests)
        if first or self._turns is None:
            self._turns = TurnSession(
                self._forward, self.model, self.pad_token_id, self.stop_token_ids,
                temperature, top_p, seed,
            )  # fmt: skip
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self._turns.turn(requests)
        finally:
            self.model.train(was_training)
        return out

    def end_turns(self) -> None:
        """Free the turn session's cache (the multi-turn rollout is over)."""
        self._turns = None

    def _check(self, prompts, n, temperature, top_p, max_tokens, group_ids, group_id_offset):
        check_sampling_args(temperature, top_p)
        vocab = int(self.model.config.vocab_size)
        return check_generate_args(prompts, n, max_tokens, vocab, group_ids, group_id_offset)

    def _forward(self, ids: Tensor, mask: Tensor, pos: Tensor, cache) -> Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1]

    def _generate_chunk(self, prompts, n, temperature, top_p, max_tokens, generator):
        dev = self.device
        k, p = len(prompts), max(len(x) for x in prompts)
        unique, rows_of = distinct_prompts(prompts, n)
        ids, mask = (t.to(dev) for t in left_pad(unique, self.pad_token_id))
        cache = rollout_cache(self.model.config, p + max_tokens)
        logits = self._forward(ids, mask, position_ids_from_mask(mask), cache)
        next_pos = mask.sum(-1)
        if len(rows_of) > len(unique):  # every sample row gets its prompt's cache
            rows_of = rows_of.to(dev)
            cache.batch_select_indices(rows_of)
            logits, mask, next_pos = (t[rows_of] for t in (logits, mask, next_pos))
        rows = k * n
        lp_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        out_tok = torch.full((rows, max_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((rows, max_tokens), dtype=lp_dtype, device=dev)
        lengths = torch.full((rows,), max_tokens, dtype=torch.long, device=dev)
        stopped = torch.zeros(rows, dtype=torch.bool, device=dev)
        stop_ids = torch.as_tensor(self.stop_token_ids, dtype=torch.long, device=dev)
        alive = torch.arange(rows, device=dev)  # original row of each cache row
        done = torch.zeros(rows, dtype=torch.bool, device=dev)
        for t in range(max_tokens):
            tok, lp = sample_tokens(logits, temperature, top_p, generator)
            out_tok[alive, t] = torch.where(done, self.pad_token_id, tok)
            out_lp[alive, t] = torch.where(done, 0.0, lp.to(lp_dtype))
            hit = torch.isin(tok, stop_ids) & ~done
            lengths[alive] = torch.where(hit, t + 1, lengths[alive])
            stopped[alive] |= hit
            done |= hit
            n_done = int(done.sum())
            if n_done == done.numel() or t == max_tokens - 1:
                break
            if n_done * 8 >= done.numel():
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                alive, tok, mask, next_pos, done = (
                    x[keep] for x in (alive, tok, mask, next_pos, done)
                )
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self._forward(tok[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return out_tok, out_lp, lengths, stopped
