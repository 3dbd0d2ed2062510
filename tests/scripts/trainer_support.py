"""Tiny models and hand-written objectives for the trainer tests (test-only code).

The policy-gradient reductions here follow the loss-type table of DESIGN.md with plain torch ops,
independently of the library's own primitives, so the trainer is tested against our definition.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    MetricAdapter,
    Objective,
    OldLogpCache,
    Reduction,
)
from posttrain.data.logprobs import response_logprobs

LOSS_TYPES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-fixed")
VOCAB = 64


def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64):
    """A 2-layer Llama from a config (transformers is imported only when a test needs it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _quiet_transformers()
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype)


def tiny_gpt2(seed: int = 0, dtype: torch.dtype = torch.float64):
    """A model whose every op runs in its own dtype (Llama's RMSNorm computes in float32), so
    float64 comparisons can be tight to ~1e-13."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _quiet_transformers()
    cfg = GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).to(dtype)


class TinyCausalLM(nn.Module):
    """A one-block causal LM in plain torch, for subprocess tests that should not pay for
    importing transformers. Accepts the keyword arguments ``response_logprobs`` passes."""

    def __init__(self, seed: int = 0, dim: int = 16, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(64, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)
        self.to(dtype)

    def forward(self, input_ids, attention_mask, position_ids, logits_to_keep=0, **_):
        h = self.embed(input_ids) + self.pos(position_ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        s = input_ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=h.device).tril()
        allowed = causal[None] & attention_mask.bool()[:, None, :]
        allowed = allowed | torch.eye(s, dtype=torch.bool, device=h.device)[None]  # pad rows
        scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5
        h = self.norm(h + torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.head(h))


def reduce_loss(per_token, mask, loss_type, max_response_length=None):
    """(numerator, weight) per the DESIGN.md table; weight is a plain float."""
    m = mask.to(per_token.dtype)
    token_sums = (per_token * m).sum(-1)
    lengths = m.sum(-1)
    n = float(per_token.shape[0])
    if loss_type == "token-mean":
        return token_sums.sum(), float(lengths.sum())
    if loss_type == "seq-mean-token-mean":
        return (token_sums / lengths.clamp(min=1)).sum(), n
    if loss_type == "seq-mean-token-sum":
        return token_sums.sum(), n
    if loss_type == "seq-mean-token-sum-fixed":
        return token_sums.sum() / max_response_length, n
    raise ValueError(loss_type)


def pg_objective(loss_type: str, *, max_response_length: int | None = None, use_pi_old=False):
    """A TOKEN_SUM policy-gradient surrogate; with π_old, an unclipped importance ratio."""
    cache = OldLogpCache() if use_pi_old else None

    def fn(model, batch):
        logp = response_logprobs(model, batch)
        adv = batch.advantages.to(logp.dtype)[:, None]
        metrics = {}
        if cache is not None:
            log_ratio = logp - cache.old_logprobs(batch, logp).to(logp.dtype)
            per_token = -adv * torch.exp(log_ratio)
            masked = log_ratio.detach()[batch.response_mask]
            metrics["max_abs_log_ratio"] = masked.abs().max() if masked.numel() else 0.0
        else:
            per_token = -adv * logp
        num, weight = reduce_loss(per_token, batch.response_mask, loss_type, max_response_length)
        loss = num / max(weight, 1.0)
        metrics.update({OBJECTIVE_WEIGHT_SUM: weight, "pg_loss": loss.detach(), "rows": len(batch)})
        return loss, metrics

    adapter = MetricAdapter(
        {"pg_loss": "pg/loss", "max_abs_log_ratio": "pg/max_abs_log_ratio"},
        frozenset({"rows"}),
        reductions={"max_abs_log_ratio": "max"},
    )
    identity = {"objective": "test_pg", "loss_type": loss_type, "pi_old": use_pi_old}
    return Objective(fn, Reduction.TOKEN_SUM, adapter, cache, identity=identity)


def mean_objective():
    """A MEAN objective: the sample mean of each response's advantage-weighted mean NLL."""

    def fn(model, batch):
        logp = response_logprobs(model, batch)
        m = batch.response_mask.to(logp.dtype)
        per_sample = -(logp * m).sum(-1) / m.sum(-1).clamp(min=1)
        loss = (per_sample * batch.advantages.to(logp.dtype)).mean()
        return loss, {"nll": per_sample.mean().detach()}

    return Objective(
        fn, Reduction.MEAN, MetricAdapter({"nll": "mean/nll"}), identity={"objective": "test_mean"}
    )
