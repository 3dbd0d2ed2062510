"""A rollout engine for GPUs: static KV buffers, CUDA-graph decode steps, no per-token host sync.

Prefill runs the HF forward once per distinct prompt (as the torch engine does; the buffers then
get a copy for each sample row); decoding then runs :class:`StaticDecoder` steps over fixed-shape
buffers. Rows are never compacted: a finished
row keeps its slot and its outputs are masked on the device, so the host reads nothing per token
and only checks every ``check_every`` tokens whether all rows are done. On CUDA each
(rows, context bucket) step is captured once as a CUDA graph and replayed; weights are updated
in place (``sync_weights`` copies into the same storage), so captured graphs stay valid.
On the CPU the same steps run eagerly — that is the path the CPU tests check against a full
recompute.

Sampling (temperature, top-p, exact logprobs) is ``rollout.sampling``'s, on the device. Same seed,
prompts and weights -> same samples; without compaction the random stream differs from the torch
engine's once rows finish, so the two engines agree sample for sample only while no row stops.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posttrain.data.logprobs import position_ids_from_mask
from posttrain.rollout.base import left_pad
from posttrain.rollout.capabilities import STATIC
from posttrain.rollout.kv_cache import rollout_cache
from posttrain.rollout.sampling import sample_tokens
from posttrain.rollout.static_decode import StaticDecoder, unsupported_reason
from posttrain.rollout.torch_engine import TorchRolloutEngine, distinct_prompts


class GraphRolloutEngine(TorchRolloutEngine):
    """``TorchRolloutEngine`` with static-buffer decoding (CUDA graphs on CUDA by default).

    ``context_bucket``: attention spans the filled slots rounded up to a multiple of this, so
    one graph serves a range of context lengths. ``cuda_graphs=None`` uses graphs on CUDA only.
    Multi-turn continuation is not built on the static buffers: it declares no ``multi_turn``.
    """

    capabilities = STATIC

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        *,
        context_bucket: int = 64,
        check_every: int = 16,
        cuda_graphs: bool | None = None,
        **kw,
    ) -> None:
        super().__init__(model, tokenizer, **kw)
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"rollout.engine=static: {reason}; use rollout.engine=torch")
        if context_bucket < 1 or check_every < 1:
            raise ValueError("context_bucket and check_every must be >= 1")
        self.context_bucket = context_bucket
        self.check_every = check_every
        self.cuda_graphs = cuda_graphs
        self._decoders: dict[tuple[int, int], StaticDecoder] = {}
        self._graphs: dict[tuple[int, int, int], tuple] = {}

    def generate_turns(self, requests, *, temperature: float, top_p: float, seed: int):
        if requests:
            raise ValueError(
                "rollout.engine=static has no multi-turn continuation; use rollout.engine=torch"
            )
        self.end_turns()
        return []

    def _decoder(self, rows: int, capacity: int) -> StaticDecoder:
        key = (rows, capacity)
        if key not in self._decoders:
            dtype = next(self.model.parameters()).dtype
            self._decoders[key] = StaticDecoder(self.model, rows, capacity, dtype)
        return self._decoders[key]

    def _use_graphs(self) -> bool:
        on_cuda = self.device.type == "cuda"
        if self.cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        return on_cuda if self.cuda_graphs is None else self.cuda_graphs

    def _step(self, dec: StaticDecoder, tok: Tensor, pos: Tensor, slot: Tensor, context: int):
        if not self._use_graphs():
            return dec.step(tok, pos, slot, context)
        key = (tok.shape[0], dec.capacity, context)
        if key not in self._graphs:
            self._graphs[key] = self._capture(dec, tok, pos, slot, context)
        graph, (tok_in, pos_in, slot_in), logits = self._graphs[key]
        tok_in.copy_(tok)
        pos_in.copy_(pos)
        slot_in.copy_(slot)
        graph.replay()
        return logits

    @staticmethod
    def _capture(dec: StaticDecoder, tok: Tensor, pos: Tensor, slot: Tensor, context: int):
        inputs = (tok.clone(), pos.clone(), slot.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: rewrites the current slot with itself
            dec.step(*inputs, context)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = dec.step(*inputs, context)
        return graph, inputs, logits

    def _generate_chunk(self, prompts, n, temperature, top_p, max_tokens, generator):
        dev = self.device
        k, p = len(prompts), max(len(x) for x in prompts)
        rows = k * n
        unique, rows_of = distinct_prompts(prompts, n)
        rows_of = rows_of.to(dev)
        ids, mask = (t.to(dev) for t in left_pad(unique, self.pad_token_id))
        cache = rollout_cache(self.model.config, p)
        logits = self._forward(ids, mask, position_ids_from_mask(mask), cache)
        # Buffers (and their graphs) are kept per (rows, capacity); rounding the capacity up to a
        # bucket lets prompts of varying width reuse them instead of adding one set per width.
        capacity = -(-(p + max_tokens) // self.context_bucket) * self.context_bucket
        dec = self._decoder(rows, capacity)
        dec.load_prefix(cache, mask, rows_of)
        logits = logits[rows_of]
        pos = mask.sum(-1)[rows_of]
        lp_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        out_tok = torch.full((rows, max_tokens), self.pad_token_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros((rows, max_tokens), dtype=lp_dtype, device=dev)
        lengths = torch.full((rows,), max_tokens, dtype=torch.long, device=dev)
        done = torch.zeros(rows, dtype=torch.bool, device=dev)
        stop_ids = torch.as_tensor(self.stop_token_ids, dtype=torch.long, device=dev)
        slot = torch.zeros(1, dtype=torch.long, device=dev)
        for t in range(max_tokens):
            tok, lp = sample_tokens(logits, temperature, top_p, generator)
            out_tok[:, t] = torch.where(done, self.pad_token_id, tok)
            out_lp[:, t] = torch.where(done, 0.0, lp.to(lp_dtype))
            hit = torch.isin(tok, stop_ids) & ~done
            lengths = torch.where(hit, t + 1, lengths)
            done = done | hit
            last = t == max_tokens - 1
            if last or ((t + 1) % self.check_every == 0 and bool(done.all())):
                break
            slot.fill_(p + t)
            context = min(capacity, -(-(p + t + 1) // self.context_bucket) * self.context_bucket)
            logits = self._step(dec, tok, pos, slot, context)
            pos = pos + 1
        return out_tok, out_lp, lengths, done
