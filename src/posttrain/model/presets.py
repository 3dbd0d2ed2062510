"""The tiny presets' dimensions and their model config as plain values (torch-free: the memory
estimate of ``posttrain config show`` reads them without building a model); ``model/tiny.py``
builds the models.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from posttrain.model.tokenizer import (
    ARITHMETIC_CHARACTERS,
    BOS,
    CHARACTERS,
    EOS,
    PAD,
    TOOL_MARKERS,
    char_vocab,
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
    #: The tool-call markers and the tools chat template (:mod:`posttrain.env.chat_template`).
    tools: bool = False
    #: Each layer attends to this many tokens (a Mistral: the Llama layers with a window).
    sliding_window: int | None = None


#: ``arith_tools``: the arithmetic alphabet plus the tools chat template's roles (``U:``, ``A:``).
TOOLS_ARITHMETIC_CHARACTERS: tuple[str, ...] = (*ARITHMETIC_CHARACTERS, "U", "A", ":", "\n")

#: ``tiny_tools``: the full alphabet plus the printable ASCII it lacks (backquote, tab), ids of the
#: full alphabet unchanged.
PRINTABLE_CHARACTERS: tuple[str, ...] = tuple(
    dict.fromkeys((*CHARACTERS, *(c for c in string.printable if c not in "\r\x0b\x0c")))
)

PRESETS: dict[str, TinyPreset] = {
    "tiny": TinyPreset(48, 3, 4, 4, 160, 256),
    "small": TinyPreset(512, 8, 8, 8, 1376, 1024),
    "arith": TinyPreset(32, 2, 4, 4, 128, 64, ARITHMETIC_CHARACTERS, tie_word_embeddings=False),
    # ``arith`` with one attention head of 32 (the same parameters): a head size vLLM's CPU
    # attention takes (it refuses 8), so the demo recipe runs with either engine.
    "arith_h32": TinyPreset(32, 2, 1, 1, 128, 64, ARITHMETIC_CHARACTERS, tie_word_embeddings=False),
    "arith_tools": TinyPreset(
        64,
        2,
        4,
        4,
        256,
        128,
        TOOLS_ARITHMETIC_CHARACTERS,
        tie_word_embeddings=False,
        tools=True,
        sliding_window=10,
    ),
    "tiny_tools": TinyPreset(48, 3, 4, 4, 160, 512, PRINTABLE_CHARACTERS, tools=True),
}


def preset_config(preset: str) -> dict[str, Any]:
    """The HF config values of a preset, sized to its char-level vocabulary (``sliding_window``
    present only for a preset with a window: a Mistral)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[preset]
    vocab = char_vocab(p.characters)
    window = {} if p.sliding_window is None else {"sliding_window": p.sliding_window}
    return {
        "vocab_size": len(vocab) + (len(TOOL_MARKERS) if p.tools else 0),
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_hidden_layers,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "intermediate_size": p.intermediate_size,
        "max_position_embeddings": p.max_position_embeddings,
        "pad_token_id": vocab[PAD],
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "tie_word_embeddings": p.tie_word_embeddings,
        "attention_dropout": 0.0,
        **window,
    }
