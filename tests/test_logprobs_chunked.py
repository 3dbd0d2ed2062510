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
