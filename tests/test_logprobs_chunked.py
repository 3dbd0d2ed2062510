"""Chunked log-probs (no full-vocab logits for the whole batch) equal the one-shot path."""

from __future__ import annotations

import pytest
import torch
from conftest import random_batch, tiny_llama

from posttrain.data import logprobs as lp


def _grads(model, batch, **kw):
    model.zero_grad()
    out = lp.response_logprobs(model, batch, 0.7, **kw)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def _tied_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(cfg).double()


@pytest.mark.parametrize("make", [lambda: tiny_llama(seed=2), _tied_llama], ids=["untied", "tied"])
def test_chunked_values_and_gradients_match_the_one_shot_path(make):
    model, batch = make(), random_batch(seed=5, b=7)
    whole, g_whole = _grads(model, batch, chunk_elements=1 << 30)
    # 16-token vocab x R=5 -> 80 logits per row: 100 elements gives chunks of one row.
    chunked, g_chunked = _grads(model, batch, chunk_elements=100)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    for a, b in zip(g_chunked, g_whole, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_chunked_under_no_grad_matches():
    model, batch = tiny_llama(seed=3), random_batch(seed=6, b=5)
    with torch.no_grad():
        whole = lp.response_logprobs(model, batch, chunk_elements=1 << 30)
        chunked = lp.response_logprobs(model, batch, chunk_elements=170)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)


def test_a_modified_head_keeps_the_model_path():
    model = tiny_llama(seed=4)
    assert lp._plain_head(model) is model.lm_head
    model.config.final_logit_softcapping = 30.0
    assert lp._plain_head(model) is None


@pytest.mark.parametrize("chunk", [1 << 24, 7, 1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprob_gradient_is_log_softmax_s(monkeypatch, chunk, temperature):
    """The closed-form backward (written per chunk of rows) equals autograd through
    ``log_softmax``; the metric entropy equals ``-sum p log p``; float64 throughout."""
    monkeypatch.setattr(lp, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(5, 4, 11, generator=g, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, 11, (5, 4), generator=g)
    weights = torch.randn(5, 4, generator=g, dtype=torch.float64)
    logp, ent = lp.token_logprobs_and_entropy(logits, targets, temperature, "metric")
    (grad,) = torch.autograd.grad((logp * weights).sum(), logits)
    ref_logits = logits.detach().clone().requires_grad_()
    log_soft = torch.log_softmax(ref_logits / temperature, dim=-1)
    ref = log_soft.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), ref_logits)
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, -(log_soft.exp() * log_soft).sum(-1), rtol=0, atol=1e-12)
    assert not ent.requires_grad
    assert torch.autograd.gradcheck(
        lambda x: lp.token_logprobs(x, targets, temperature), (logits.detach().requires_grad_(),)
    )


def test_fused_logprob_keeps_bf16_logits_gradient_in_bf16():
    logits = torch.randn(3, 2, 9, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 9, (3, 2))
    logp = lp.token_logprobs(logits, targets)
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want = torch.log_softmax(logits.detach().float(), -1).gather(-1, targets.unsqueeze(-1))
    torch.testing.assert_close(logp, want.squeeze(-1))
    assert lp.token_logprobs(logits[:0], targets[:0]).shape == (0, 2)


def test_fused_logprob_with_large_and_masked_logits():
    """Logits far from 0 and -inf entries (a masked vocabulary) give log_softmax's values, with
    and without the entropy pass (its own max-shifted logsumexp)."""
    logits = torch.randn(4, 10, dtype=torch.float64) * 50 + 1e4
    logits[:, 7:] = float("-inf")
    targets = torch.tensor([0, 3, 6, 2])
    want = torch.log_softmax(logits[:, :7], -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(lp.token_logprobs(logits, targets), want)
    logp, _ = lp.token_logprobs_and_entropy(logits, targets, 1.0, "metric")
    torch.testing.assert_close(logp, want)
