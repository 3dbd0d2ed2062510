"""A checkpoint as a plain Hugging Face folder (``from_pretrained`` loads it), written atomically.

One function for every kind of checkpoint, used by ``posttrain model export`` and at the end of
a run (``checkpoint.export_final``: ``RUN_DIR/final_model``):

- **sharded** (``dcp/``): the weights are read from the shards one decoder layer at a time
  (``dcp.hf_from_dcp``); LoRA adapters are merged in.
- **replicated, LoRA**: ``model/`` holds only the adapters; each layer's base weights are read
  from the run's base model folder (``model.name_or_path`` in the checkpoint's config), cast to
  float32 as the policy held them, and merged, ``W + (alpha/r) B A``, one layer at a time.
- **replicated, full weights**: ``model/`` already is such a folder; its files are hard-linked
  (copied where the filesystem cannot link), so the export costs no disk and outlives the
  checkpoint's pruning. Rewriting a file of the export in place would change the checkpoint's
  too (its manifest then refuses it): write a changed model to a new folder.

The folder is written as ``.tmp-NAME`` beside ``out`` and renamed into place when complete, so a
crash leaves no half folder under ``out``; the next export removes the leftover. It records
what it was made from in ``posttrain_export.json`` (checkpoint name and step), which
``from_pretrained`` ignores and the end of a run reads to know whether an export is current.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from posttrain.fileio import fsync_dir
from posttrain.run.records import FINAL_DIR
from posttrain.trainer.checkpoint import CheckpointManager
from posttrain.trainer.dcp import hf_from_dcp, is_sharded_checkpoint, lora_scale, write_layers
from posttrain.trainer.errors import CheckpointError
from posttrain.trainer.manifest import verify
from posttrain.trainer.model_io import ADAPTER_FILE, INDEX_FILE, SINGLE_FILE

MARKER = "posttrain_export.json"
_PEFT_PREFIX = "base_model.model."


def export_hf(checkpoint: str | os.PathLike, out: str | os.PathLike, replace: bool = False) -> Path:
    """Verify ``checkpoint`` and write it as a Hugging Face folder at ``out``.

    ``out`` must not exist (or be empty) unless ``replace``: then a previous export there is
    swapped for the new one in two renames.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    step = re.fullmatch(r"step_(\d{8,})", checkpoint.name)
    if step is None:
        raise CheckpointError(f"{checkpoint} is not a checkpoint directory (step_NNNNNNNN)")
    if not checkpoint.is_dir():
        raise CheckpointError(_missing_message(checkpoint))
    if not replace and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} already exists and is not empty; export into a new folder")
    meta = verify(checkpoint, int(step.group(1)))  # nothing is exported from a damaged one
    tmp, trash = out.with_name(f".tmp-{out.name}"), out.with_name(f".trash-{out.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    for leftover in (tmp, trash):  # an export that was interrupted
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    try:
        if is_sharded_checkpoint(checkpoint):
            hf_from_dcp(checkpoint, tmp)
        elif (checkpoint / "model" / ADAPTER_FILE).exists():
            _merge_adapters(checkpoint / "model", _base_folder(checkpoint, meta), tmp)
        else:
            _link_files(checkpoint / "model", tmp)
        marker = {"checkpoint": checkpoint.name, "step": int(step.group(1))}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        for f in tmp.iterdir():
            _fsync(f)
        fsync_dir(tmp)
        if out.exists():
            os.rename(out, trash)
        os.rename(tmp, out)
        fsync_dir(out.parent)
        shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def exported_step(folder: str | os.PathLike) -> int | None:
    """The checkpoint step an export was made from (None: no complete export there)."""
    try:
        return int(json.loads((Path(folder) / MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def export_final(checkpoint: str | os.PathLike, run_dir: str | os.PathLike) -> Path:
    """The end-of-run export: ``run_dir/final_model`` from the run's final checkpoint. A
    failure is one line that names the complete checkpoint and how to export it by hand."""
    out = Path(run_dir) / FINAL_DIR
    try:
        return export_hf(checkpoint, out, replace=True)
    except (CheckpointError, OSError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"the run finished and its checkpoint {checkpoint} is complete, but exporting it to "
            f"{out} failed ({type(e).__name__}: {first[:300]}); rerun the command to retry, or "
            f"run `posttrain model export {checkpoint} --out DIR`"
        ) from e


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_files(src: Path, out: Path) -> None:
    for f in src.iterdir():
        if f.is_file():
            try:
                os.link(f, out / f.name)
            except OSError:  # another filesystem, or one without hard links
                shutil.copy2(f, out / f.name)


def _base_folder(checkpoint: Path, meta: dict) -> Path:
    base = Path(meta["config"]["model"]["name_or_path"])
    if not (base / "config.json").is_file():
        raise CheckpointError(
            f"{checkpoint} holds LoRA adapters over the base model {str(base)!r}, which is not a "
            "model folder here; the export merges the adapters into its weights: run it where "
            "that folder exists"
        )
    return base


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of ``folder`` that holds it."""
    if (folder / INDEX_FILE).exists():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        return {name: folder / f for name, f in weight_map.items()}
    if (folder / SINGLE_FILE).exists():
        with safe_open(str(folder / SINGLE_FILE), "pt") as f:
            return dict.fromkeys(f.keys(), folder / SINGLE_FILE)
    raise CheckpointError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE} (safetensors)")


def _missing_message(checkpoint: Path) -> str:
    """A well-named checkpoint that is not there: say so, and which ones its folder holds."""
    what = "is a file, not a checkpoint folder" if checkpoint.exists() else "does not exist"
    parent = checkpoint.parent
    held = [path.name for _, path in CheckpointManager(parent).complete()]
    if held:
        shown = ", ".join(held[-5:]) + (f" (and {len(held) - 5} older)" if len(held) > 5 else "")
        return f"{checkpoint} {what}; {parent} holds the complete checkpoints {shown}"
    return f"{checkpoint} {what}, and {parent} holds no complete checkpoint; check the path"


@torch.no_grad()
def _merge_adapters(adapter_dir: Path, base: Path, out: Path) -> None:
    """The base model's weights with the adapters of ``adapter_dir`` merged in, layer by layer,
    in float32 (the policy's master dtype), as peft merges them."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = lora_scale(cfg)
    adapters = load_file(str(adapter_dir / ADAPTER_FILE))  # the small part: adapters only
    files = _weight_files(base)

    def read(names: list[str]) -> dict[str, Tensor]:
        tensors: dict[str, Tensor] = {}
        for name in names:
            with safe_open(str(files[name]), "pt") as f:
                value = f.get_tensor(name).to(torch.float32)
            stem = _PEFT_PREFIX + name.removesuffix(".weight")
            a, b = adapters.get(f"{stem}.lora_A.weight"), adapters.get(f"{stem}.lora_B.weight")
            if a is not None and b is not None:
                value = value + scale * (b @ a).to(value.dtype)
            tensors[name] = value.contiguous()
        return tensors

    write_layers(list(files), read, out)
    for f in base.iterdir():  # config.json, generation_config.json: the architecture
        if f.is_file() and f.suffix == ".json" and f.name != INDEX_FILE:
            shutil.copy2(f, out / f.name)
    for f in adapter_dir.iterdir():  # the tokenizer the run saved (it may differ from base's)
        if f.is_file() and f.name not in (ADAPTER_FILE, "adapter_config.json", "README.md"):
            shutil.copy2(f, out / f.name)
