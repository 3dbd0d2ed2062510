"""Shared pieces of the multi-turn tests: tiny tools model folders and the sampler gap. The
environments and reward functions runs name by reference are in ``role_fixtures``."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.model.tokenizer import save_char_tokenizer


def _tiny_shape(tok) -> dict:
    """The size and special ids both test models share."""
    return dict(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=64, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False, attention_dropout=0.0,
    )  # fmt: skip


def build_tools_model(out: Path, seed: int = 0, eos_logit: float = 0.5, heads: int = 4) -> Path:
    """A random tiny Llama whose vocabulary is the tools tokenizer's (char ids + tool markers);
    ``heads=1`` gives head size 32, which vLLM's CPU attention takes (8 it refuses).

    A random model almost never samples EOS, so its turns would all run out of tokens: a bias
    of the last MLP plus an untied EOS row of the head add about ``eos_logit`` to EOS's logit
    everywhere, so turns end at varied lengths.
    """
    tok = build_tools_tokenizer()
    shape = {**_tiny_shape(tok), "num_attention_heads": heads, "num_key_value_heads": heads}
    config = LlamaConfig(**shape, mlp_bias=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            u = torch.zeros(config.hidden_size)
            u[0] = 1.0
            model.model.layers[-1].mlp.down_proj.bias.copy_(u * 50.0)
            model.lm_head.weight[tok.eos_token_id] += u * eos_logit
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    save_char_tokenizer(tok, out)
    return out


def build_sliding_tools_model(out: Path, window: int = 4, seed: int = 0, bias: float = 2.0) -> Path:
    """:func:`build_tools_model` as a Qwen2 whose first layer attends to a window of ``window``
    tokens and whose second to the whole history: sliding and full layers in one model. The
    EOS bias comes through the last layer's value bias (attention weights sum to one, so it is
    added to every position); a small one (``bias``) keeps the logits sensitive to the window:
    a cache that drops a row's tokens past its window over columns moves them by ~2e-5."""
    tok = build_tools_tokenizer()
    config = Qwen2Config(
        **_tiny_shape(tok),
        use_sliding_window=True,
        sliding_window=window,
        max_window_layers=1,
        layer_types=["sliding_attention", "full_attention"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            attn = model.model.layers[-1].self_attn
            attn.o_proj.weight.zero_()
            attn.o_proj.weight[0, 0] = 1.0
            attn.v_proj.bias.zero_()
            attn.v_proj.bias[0] = bias
            u = torch.zeros(config.hidden_size)
            u[0] = 1.0
            model.lm_head.weight[tok.eos_token_id] += u * 0.5
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    save_char_tokenizer(tok, out)
    return out


def worst_sampler_gap(model, batch) -> float:
    """Largest |sampler logprob - one unpadded full-sequence forward's| over ``batch``'s policy
    tokens (the recompute every multi-turn exactness test compares with)."""
    worst = 0.0
    with torch.no_grad():
        for i in range(len(batch)):
            row = batch.input_ids[i][batch.attention_mask[i].bool()]
            logp = torch.log_softmax(model(row[None]).logits[0].double(), -1)
            p = int(batch.attention_mask[i, : batch.prompt_width].sum())
            at = batch.response_mask[i].nonzero().squeeze(1)
            full = logp[p + at - 1].gather(1, row[p + at][:, None]).squeeze(1)
            gap = (full - batch.rollout_logprobs[i, at].double()).abs().max()
            worst = max(worst, float(gap))
    return worst
