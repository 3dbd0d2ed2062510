"""Model weights in the Hugging Face directory layout, read back into a live module.

Saving uses ``save_pretrained`` for Hugging Face models (so ``from_pretrained(dir)`` works) and a
single ``model.safetensors`` otherwise; a peft (LoRA) model saves its adapters only. Loading
reads the safetensors files directly into the existing module, keeping its identity (the
optimizer holds references to its parameters).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model
from torch import nn

from posttrain.trainer.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_FILE = "adapter_model.safetensors"
#: What diffusers' ``save_pretrained`` writes for one model (a UNet, a VAE).
DIFFUSERS_FILE = "diffusion_pytorch_model.safetensors"


def save_model_dir(model: nn.Module, directory: Path, tokenizer: object | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(directory)
    else:
        save_model(model, str(directory / SINGLE_FILE))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def _shard_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    for name in (SINGLE_FILE, DIFFUSERS_FILE):
        if (directory / name).exists():
            return [directory / name]
    raise CheckpointError(f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


@torch.no_grad()
def load_model_dir(model: nn.Module, directory: Path) -> None:
    """Copy saved tensors into ``model``; only tied aliases of loaded tensors may be absent."""
    if (directory / ADAPTER_FILE).exists():
        _load_adapters(model, directory)
        return
    loaded: dict[str, torch.Tensor] = {}
    for f in _shard_files(directory):
        loaded.update(load_file(str(f)))
    own = model.state_dict()
    unexpected = sorted(set(loaded) - set(own))
    if unexpected:
        raise CheckpointError(f"{directory}: tensors not in the model: {unexpected[:5]}")
    loaded_ptrs = {own[k].data_ptr() for k in loaded}
    missing = [k for k in own if k not in loaded and own[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise CheckpointError(
            f"{directory}: model tensors missing from the checkpoint: {missing[:5]}"
        )
    for name, value in loaded.items():
        target = own[name]
        if target.shape != value.shape or target.dtype != value.dtype:
            raise CheckpointError(
                f"{directory}: {name} is {value.dtype}{tuple(value.shape)} but the model holds "
                f"{target.dtype}{tuple(target.shape)}; resume with the model dtype and shape saved"
            )
        target.copy_(value.to(device=target.device))


def _load_adapters(model: nn.Module, directory: Path) -> None:
    """peft adapters (saved without the adapter name in their keys) into a peft model."""
    from peft import set_peft_model_state_dict

    try:
        result = set_peft_model_state_dict(model, load_file(str(directory / ADAPTER_FILE)))
    except (RuntimeError, AttributeError) as e:
        raise CheckpointError(
            f"{directory}: the saved adapters do not fit the model ({str(e).splitlines()[0]}); "
            "resume with the model.lora_* settings saved"
        ) from None
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise CheckpointError(
            f"{directory}: adapter tensors unexpected {sorted(result.unexpected_keys)[:3]}, "
            f"missing {missing[:3]}; resume with the model.lora_* settings saved"
        )
