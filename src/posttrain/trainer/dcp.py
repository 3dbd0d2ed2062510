"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), and their HF export.

A sharded trainer's checkpoint has the usual layout (``checkpoint.py``: temp directory, manifest,
``COMPLETE`` marker, ``trainer.pt`` with the scheduler and counters, per-rank RNG), except that
the weights and the optimizer state live in ``dcp/`` — every rank writes its own shards
(``__<rank>_0.distcp``) and rank 0 the ``.metadata`` — and ``model/`` holds only the model's
``config.json`` (and tokenizer), which is what an export needs besides the tensors.

DCP stores each tensor with its global shape and reshards on load, so a checkpoint written by N
ranks loads into any number of sharded ranks, or into one unsharded process. Tensors are keyed by
parameter name (``get_state_dict``), the optimizer state included, so the load does not depend
on how parameters were grouped or ordered.

:func:`hf_from_dcp` writes a DCP checkpoint's weights as a plain Hugging Face folder one decoder
layer at a time (never all the float32 weights at once), merging LoRA adapters into their base
weights; ``export.py`` makes that (and the other kinds of checkpoint) an atomic export.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import warnings
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import Tensor
from torch.distributed.checkpoint.api import CheckpointException

from posttrain.trainer import distributed as dp
from posttrain.trainer import sharding as sh
from posttrain.trainer.errors import CheckpointError, PoisonedStateError

DCP_DIR = "dcp"
ADAPTER_CONFIG = "adapter_config.json"
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_PEFT_PREFIX = "base_model.model."


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / DCP_DIR).is_dir()


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns that it assumes one process when no group exists; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _states(trainer) -> dict:
    """What DCP saves and loads in place: the policy's weights and optimizer state, and the
    tensors of any ``trainer.extra_state`` component that keeps them here (``dcp_tensors``:
    a sharded reference's weights, which ``trainer.pt`` on rank 0 could not hold)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    states = {"model": model_sd, "optim": optim_sd}
    extra = {
        name: tensors
        for name, component in trainer.extra_state.items()
        if (tensors := getattr(component, "dcp_tensors", dict)())
    }
    return states | ({"extra": extra} if extra else {})


def refuse_poisoned(trainer) -> None:
    """Refuse to save NaN/inf weights or optimizer state, judged on every rank's shards."""
    if not sh.all_finite(p for p in trainer.model.parameters()):
        raise PoisonedStateError("refusing to save: a parameter shard holds NaN or inf")
    state = [v for s in trainer.optimizer.state.values() for v in s.values()]
    if not sh.all_finite(v for v in state if isinstance(v, Tensor)):
        raise PoisonedStateError("refusing to save: an optimizer state shard holds NaN or inf")


def save_sharded(directory: Path, trainer, tokenizer: object | None = None) -> None:
    """Every rank writes its shards of weights and optimizer state under ``directory/dcp``;
    rank 0 writes the model config (and tokenizer, adapter config) under ``directory/model``."""
    try:
        with _quiet_single_process():
            dcp.save(_states(trainer), checkpoint_id=str(directory / DCP_DIR))
    except CheckpointException as e:  # every rank gets every rank's failure
        cause = _rank_failure(e)
        if cause is None:
            raise
        raise cause from e
    if dp.rank() == 0:
        model_dir = directory / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        model = trainer.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if getattr(base, "config", None) is not None:
            base.config.save_pretrained(model_dir)
        if hasattr(model, "peft_config"):
            (model_dir / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(model), indent=1))
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)


def _rank_failure(error: CheckpointException) -> BaseException | None:
    """The error a rank's write failed with, out of DCP's wrapper (a ``BaseException`` whose
    text holds every rank's traceback): an ``OSError`` first (a full disk, a removed folder),
    so the save reports it as a single-process save does (``save_errors.write_failure``)."""
    failures = [exc for _, (exc, _trace) in sorted(error.failures.items())]
    for exc in failures:
        if isinstance(exc, OSError):
            return exc
    return failures[0] if failures else None


def load_sharded(directory: Path, trainer) -> None:
    """Weights and optimizer state from ``directory/dcp``, resharded to this run's ranks."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _states(trainer)
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=str(directory / DCP_DIR))
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{directory}: the sharded checkpoint does not fit this model ({first}); resume with "
            "the model and model.lora_* settings it was saved with"
        ) from None
    set_state_dict(
        trainer.model,
        trainer.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
    )


@torch.no_grad()
def hf_from_dcp(checkpoint: Path, out: Path) -> None:
    """Write the weights of a (verified) DCP checkpoint into the existing folder ``out`` as a
    Hugging Face folder, one decoder layer at a time; LoRA adapters are merged in."""
    meta = dcp.FileSystemReader(str(checkpoint / DCP_DIR)).read_metadata()
    shapes = {
        k[len("model.") :]: v
        for k, v in meta.state_dict_metadata.items()
        if k.startswith("model.") and hasattr(v, "size")
    }
    adapters = checkpoint / "model" / ADAPTER_CONFIG
    scale = lora_scale(json.loads(adapters.read_text()) if adapters.exists() else None)

    def read(names: list[str]) -> dict[str, Tensor]:
        wanted = {
            n: torch.empty(tuple(shapes[n].size), dtype=shapes[n].properties.dtype) for n in names
        }
        with _quiet_single_process():
            dcp.load({"model": wanted}, checkpoint_id=str(checkpoint / DCP_DIR))
        return plain_names(wanted, scale)

    write_layers(list(shapes), read, out)
    for f in (checkpoint / "model").iterdir():
        if f.is_file() and f.name != ADAPTER_CONFIG:
            shutil.copy2(f, out / f.name)


def write_layers(names: list[str], read, out: Path) -> None:
    """Safetensors files in ``out``, one per decoder layer plus one for the rest, and their
    index: ``read(names)`` returns one group's tensors under their plain names, so no more
    than one layer (or the embeddings) is held at a time."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        m = _LAYER.search(name)
        groups[f"layer{int(m.group(1)):05d}" if m else "other"].append(name)
    order = sorted(groups)
    weight_map: dict[str, str] = {}
    total = 0
    for i, group in enumerate(order):
        tensors = read(groups[group])
        fname = f"model-{i + 1:05d}-of-{len(order):05d}.safetensors"
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def adapter_config(model) -> dict:
    return json.loads(json.dumps(model.peft_config["default"].to_dict(), default=list))


@torch.no_grad()
def gathered_weights(model) -> dict[str, Tensor]:
    """The full weights of a sharded model on rank 0 (CPU; other ranks get ``{}``), under a
    plain model's names with LoRA merged in: what the rollout loads. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=opts)
    if not full:
        return {}
    scale = lora_scale(adapter_config(model)) if hasattr(model, "peft_config") else None
    return plain_names(full, scale)


def lora_scale(cfg: dict | None) -> float | None:
    """peft's adapter scale from its config (None: no adapters)."""
    if cfg is None:
        return None
    if cfg.get("use_rslora"):
        return cfg["lora_alpha"] / cfg["r"] ** 0.5
    return cfg["lora_alpha"] / cfg["r"]


def plain_names(tensors: dict[str, Tensor], scale: float | None) -> dict[str, Tensor]:
    """Names and values a plain (un-wrapped) model of the architecture loads: peft's prefix
    and ``base_layer`` dropped, ``W + scale * B @ A`` for every adapted weight."""
    out: dict[str, Tensor] = {}
    for name, value in tensors.items():
        if ".lora_" in name:
            continue
        plain = name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")
        if scale is not None and name.endswith(".base_layer.weight"):
            stem = name[: -len(".base_layer.weight")]
            a, b = (
                tensors.get(f"{stem}.lora_A.default.weight"),
                tensors.get(f"{stem}.lora_B.default.weight"),
            )
            if a is not None and b is not None:
                value = value + scale * (b @ a).to(value.dtype)
        out[plain] = value.contiguous()
    return out
