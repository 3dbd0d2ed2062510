"""Character-level tokenizer for the tiny models, and tokenizer loading for any model folder.

One token per character keeps the arithmetic demo legible ("12+7=" is six tokens after <bos>) and
needs no training data. The folder is marked in ``tokenizer_config.json`` so loading can pick the
plain fast-tokenizer class: with a Llama config beside it, ``AutoTokenizer`` may substitute a
byte-level Llama tokenizer that does not round-trip our characters.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from posttrain.model.errors import ModelLoadError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
# Digits and arithmetic first so their ids stay small and stable across vocabulary growth.
CHARACTERS: tuple[str, ...] = tuple(
    dict.fromkeys(
        string.digits
        + "+-*/=()"
        + " "
        + string.ascii_lowercase
        + string.ascii_uppercase
        + ".,:;!?'\"%<>_#&@[]{}|^~$\\\n"
    )
)
#: The arithmetic alphabet: a smaller output space makes exploration from random weights cheaper.
ARITHMETIC_CHARACTERS: tuple[str, ...] = tuple(string.digits + "+-*/=()" + " ")
#: Tool-call markers (Hermes/Qwen format): one token each with ``build_char_tokenizer(markers=)``.
TOOL_MARKERS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
CHAR_LEVEL_MARKER = "posttrain_char_level"
"""Key set to ``true`` in ``tokenizer_config.json`` of folders written by this module."""


def char_vocab(characters: tuple[str, ...] = CHARACTERS) -> dict[str, int]:
    """Token -> id: special tokens at 0..3 (pad, bos, eos, unk), then one id per character."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *characters))}


def build_char_tokenizer(
    characters: tuple[str, ...] = CHARACTERS, markers: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """A fast tokenizer that splits text into single characters and prepends ``<bos>``.

    Unknown characters map to ``<unk>``; decoding concatenates tokens without separators.
    ``markers`` (e.g. :data:`TOOL_MARKERS`) become single tokens after the characters; they are
    not special, so decoding with ``skip_special_tokens=True`` keeps them.
    """
    vocab = char_vocab(characters)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # every character is its own piece; "[\s\S]" because "." would skip newlines
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.add_tokens(list(markers))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )


def save_char_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """Save as a normal HF tokenizer folder and add the char-level marker."""
    out = Path(out_dir)
    tokenizer.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[CHAR_LEVEL_MARKER] = True
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def is_char_level(path: str | Path) -> bool:
    cfg_path = Path(path) / "tokenizer_config.json"
    if not cfg_path.is_file():
        return False
    try:
        return bool(json.loads(cfg_path.read_text()).get(CHAR_LEVEL_MARKER, False))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_path}: not valid JSON ({e}); fix or regenerate the file") from e


def load_tokenizer(path: str | Path):
    """Load a local tokenizer folder; never contacts a hub."""
    p = Path(path)
    if not p.is_dir():
        raise ModelLoadError(
            f"tokenizer folder {str(p)!r} (model.tokenizer_path, else model.name_or_path) is not "
            "a directory; point it at a local HF folder with the tokenizer files"
        )
    try:
        if is_char_level(p):
            return PreTrainedTokenizerFast.from_pretrained(p, local_files_only=True)
        # AutoTokenizer reads the model's config through transformers' configuration module,
        # which imports torch: imported here, the char-level path stays torch-free.
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"tokenizer folder {str(p)!r} holds no usable tokenizer ({type(e).__name__}; "
            "--debug shows it); copy the model's tokenizer files there or set "
            "model.tokenizer_path to a folder that has them"
        ) from e
