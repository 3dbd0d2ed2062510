"""Tiny Llama-architecture models with the char-level tokenizer, for tests and CPU demos.

Parameter counts (vocabulary of 99 characters/specials, tied input/output embeddings):

========  ======  ======  =====  =====  =====  ============
preset    hidden  layers  heads  kv     ffn    parameters
========  ======  ======  =====  =====  =====  ============
tiny      48      3       4      4      160    101,856
small     512     8       8      8      1376   25,356,288
arith     32      2       4      4      128    34,336
========  ======  ======  =====  =====  =====  ============

``arith`` is the arithmetic demo's model: the 22-token arithmetic alphabet (digits, operators,
``=``, space and the specials) and untied embeddings. Sampling from random weights over 22
tokens rather than 99 finds well-formed numbers far more often, which is what lets RL from scratch
get going.

(exact numbers: ``count_parameters`` on a built model; the tests pin them.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.model.tokenizer import (
    ARITHMETIC_CHARACTERS,
    BOS,
    CHARACTERS,
    EOS,
    PAD,
    build_char_tokenizer,
    char_vocab,
    save_char_tokenizer,
)


@dataclass(frozen=True)
class TinyPreset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    characters: tuple[str, ...] = CHARACTERS
    tie_word_embeddings: bool = True


PRESETS: dict[str, TinyPreset] = {
    "tiny": TinyPreset(48, 3, 4, 4, 160, 256),
    "small": TinyPreset(512, 8, 8, 8, 1376, 1024),
    "arith": TinyPreset(32, 2, 4, 4, 128, 64, ARITHMETIC_CHARACTERS, tie_word_embeddings=False),
}


def tiny_config(preset: str) -> LlamaConfig:
    """The LlamaConfig of a preset, sized to the char-level vocabulary."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    vocab = char_vocab(p.characters)
    return LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        pad_token_id=vocab[PAD],
        bos_token_id=vocab[BOS],
        eos_token_id=vocab[EOS],
        tie_word_embeddings=p.tie_word_embeddings,
        attention_dropout=0.0,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_tiny_model(preset: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Build a randomly initialised model of ``preset`` and save it as an HF folder.

    The folder holds ``config.json``, ``model.safetensors``, ``generation_config.json`` and the
    char-level tokenizer; ``load_policy(out_dir)`` loads it back. Same seed -> same weights.
    """
    config = tiny_config(preset)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a directory; choose another path")
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    save_char_tokenizer(build_char_tokenizer(PRESETS[preset].characters), out)
    return out
