"""Shared fixtures: tiny float64 models and synthetic trajectory batches built locally."""

from __future__ import annotations

import pytest
import torch

from posttrain.data.trajectory import TrajectoryBatch


def tiny_llama(seed: int = 0, vocab: int = 16, dtype: torch.dtype = torch.float64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).to(dtype)


def random_batch(
    seed: int = 0,
    b: int = 6,
    p: int = 3,
    r: int = 5,
    vocab: int = 16,
    group_size: int = 2,
    per_token_adv: bool = False,
) -> TrajectoryBatch:
    """Left-padded prompts, right-padded responses of random lengths (some rows may be empty)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, p + r), generator=g)
    attn = torch.ones(b, p + r, dtype=torch.long)
    prompt_len = torch.randint(1, p + 1, (b,), generator=g)
    resp_len = torch.randint(0, r + 1, (b,), generator=g)
    resp_mask = torch.arange(r).unsqueeze(0) < resp_len.unsqueeze(1)
    for i in range(b):
        attn[i, : p - prompt_len[i]] = 0
        ids[i, : p - prompt_len[i]] = 0
        attn[i, p + resp_len[i] :] = 0
        ids[i, p + resp_len[i] :] = 0
    adv_shape = (b, r) if per_token_adv else (b,)
    return TrajectoryBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp_mask,
        group_ids=torch.arange(b, dtype=torch.long) // group_size,
        sample_ids=torch.arange(b, dtype=torch.long),
        advantages=torch.randn(adv_shape, generator=g, dtype=torch.float64),
    )


@pytest.fixture
def model():
    return tiny_llama()
