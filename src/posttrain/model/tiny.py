"""Tiny Llama-architecture models with the char-level tokenizer, for tests and CPU demos.

Parameter counts (vocabulary of 99 characters/specials, tied input/output embeddings):

===========  ======  ======  =====  =====  =====  ======  ============
preset       hidden  layers  heads  kv     ffn    window  parameters
===========  ======  ======  =====  =====  =====  ======  ============
tiny         48      3       4      4      160    -       101,856
small        512     8       8      8      1376   -       25,356,288
arith        32      2       4      4      128    -       34,336
arith_tools  64      2       4      4      256    10      135,232
tiny_tools   48      3       4      4      160    -       102,144
===========  ======  ======  =====  =====  =====  ======  ============

``arith`` is the arithmetic demo's model: the 22-token arithmetic alphabet (digits, operators,
``=``, space and the specials) and untied embeddings. Sampling from random weights over 22
tokens rather than 99 finds well-formed numbers far more often, which is what lets RL from scratch
get going. ``arith_tools`` is the tools demo's (``make demo-tools``): that alphabet plus the
letters and newline of the tools chat template's roles (``U:``, ``A:``), the four tool-call
markers as single tokens, and that template. Its layers attend to the last 10 tokens only (a
Mistral: Llama layers with a sliding window): copying the calculator's result into the answer,
9 tokens later, is then found by RL in a few hundred steps; with attention over the whole
~34-token trajectory it was not found in 900 (measured with the answer turn's context as a
prompt: docs/guides/tools.md).
``tiny_tools`` is ``tiny`` for one's own tools: every printable ASCII character (tab and newline
included, so JSON and code arguments tokenize), the four tool-call markers as single tokens and the
tools chat template (``tiny`` has neither, and multi-turn rollouts need both).

(exact numbers: ``count_parameters`` on a built model; the tests pin them.)
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

from posttrain.fileio import fsync_dir
from posttrain.model.errors import ModelLoadError
from posttrain.model.loading import WEIGHT_FILES
from posttrain.model.presets import PRESETS, preset_config
from posttrain.model.tokenizer import (
    build_char_tokenizer,
    save_char_tokenizer,
)

log = logging.getLogger("posttrain")

#: Builds write into ``<parent>/.tmp-build-<name>.<random>`` and rename it into place.
_TMP_PREFIX = ".tmp-build-"
#: What a build writes: a folder holding only these (a subset) can be rebuilt safely.
_BUILD_FILES = frozenset(
    {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
     "tokenizer_config.json", "special_tokens_map.json"}
)  # fmt: skip


def tiny_config(preset: str) -> LlamaConfig | MistralConfig:
    """The config of a preset, sized to the char-level vocabulary: a Llama, or a Mistral (the
    same layers and parameters) for a preset with a sliding window."""
    values = preset_config(preset)
    return (MistralConfig if "sliding_window" in values else LlamaConfig)(**values)


def preset_tokenizer(preset: str):
    """The char-level tokenizer of a preset (with the tool markers and template for ``tools``)."""
    p = PRESETS[preset]
    if p.tools:
        from posttrain.env.chat_template import build_tools_tokenizer

        return build_tools_tokenizer(p.characters)
    return build_char_tokenizer(p.characters)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def build_tiny_model(preset: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Build a randomly initialised model of ``preset`` and save it as an HF folder.

    The folder holds ``config.json``, ``model.safetensors``, ``generation_config.json`` and the
    char-level tokenizer; ``load_policy(out_dir)`` loads it back. Same seed -> same weights.
    Everything is written into a temp folder beside ``out_dir`` and renamed into place, so a
    kill at any moment leaves no folder that looks like a model but lacks its weights.
    """
    config = tiny_config(preset)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a directory; choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{out.name}.", dir=out.parent))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config)
        model.generation_config.pad_token_id = config.pad_token_id
        model.save_pretrained(tmp, safe_serialization=True)
        save_char_tokenizer(preset_tokenizer(preset), tmp)
        _fsync_tree(tmp)
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_tiny_model(preset: str, out_dir: str | Path, seed: int = 0) -> bool:
    """Make sure ``out_dir`` holds a complete ``preset`` model; True when this call built it.

    Runs that start at once (the default recipes share one folder) agree through an exclusive
    lock on a sibling ``.<name>.lock`` file: one builds, the others wait and reuse its folder.
    A folder with this preset's ``config.json`` but no weights (what versions that wrote in place
    left after a kill) is rebuilt, with a warning; any other incomplete folder is refused. A
    complete folder is used as it is, with a warning when it is this preset's shape in an
    architecture the preset no longer builds (an older version's build).
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for stale in out.parent.glob(f"{_TMP_PREFIX}{out.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)  # a killed builder's (it held this lock)
        if (out / "config.json").is_file():
            if any((out / name).is_file() for name in WEIGHT_FILES):
                if _is_older_build(preset, out):  # any other model is the user's choice
                    log.warning(
                        "model folder %s holds a %s model built by an older version (another "
                        "architecture); using it as it is (delete it to have it rebuilt)",
                        out,
                        preset,
                    )
                return False
            if not _is_half_built(preset, out):
                raise ModelLoadError(
                    f"model folder {str(out)!r} has a config.json but no weights, and it is not "
                    f"a {preset!r} model that model.init_preset={preset} would build; point "
                    "model.name_or_path elsewhere, or delete that folder to have it built"
                )
            log.warning(
                "model folder %s holds a half-built %s model (config.json, no weights: an "
                "interrupted build); rebuilding it",
                out,
                preset,
            )
        elif out.is_dir() and any(out.iterdir()):
            raise ModelLoadError(
                f"model folder {str(out)!r} is not empty but has no config.json, so "
                f"model.init_preset={preset} will not build a model over it; empty it or point "
                "model.name_or_path elsewhere"
            )
        log.info("building a %s model at %s (seed %d)", preset, out, seed)
        build_tiny_model(preset, out, seed=seed)
        return True


#: The config entries that tell one preset's model from another's, and those a preset changed
#: over versions (``arith_tools`` was a full-attention Llama).
_SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")
_ARCHITECTURE_KEYS = ("model_type", "sliding_window")


def _matches(preset: str, out: Path, keys: tuple[str, ...]) -> bool:
    """Whether ``out/config.json`` has the values a build of ``preset`` writes under ``keys``."""
    try:
        saved = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    want = tiny_config(preset).to_dict()
    return isinstance(saved, dict) and all(saved.get(k) == want.get(k) for k in keys)


def _is_preset(preset: str, out: Path) -> bool:
    """Whether ``out/config.json`` has the shape and architecture a build of ``preset`` writes."""
    return _matches(preset, out, (*_SHAPE_KEYS, *_ARCHITECTURE_KEYS))


def _is_older_build(preset: str, out: Path) -> bool:
    """Whether ``out`` holds ``preset``'s shape in an architecture it no longer builds."""
    return _matches(preset, out, _SHAPE_KEYS) and not _matches(preset, out, _ARCHITECTURE_KEYS)


def _is_half_built(preset: str, out: Path) -> bool:
    """Whether ``out`` holds only what a build of ``preset`` writes before its weights."""
    return _is_preset(preset, out) and all(p.name in _BUILD_FILES for p in out.iterdir())


def _fsync_tree(path: Path) -> None:
    for p in path.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(path)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; into an existing non-empty folder, file by file with
    ``config.json`` last (a folder with a config then always has its weights)."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.rename(tmp, out)
    else:
        for p in sorted(tmp.iterdir(), key=lambda p: p.name == "config.json"):
            os.replace(p, out / p.name)
    fsync_dir(out.parent)
