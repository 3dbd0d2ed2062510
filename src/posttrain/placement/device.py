"""Where a local run's model-bearing roles live, and in which dtype the rollout samples."""

from __future__ import annotations

import torch

from posttrain.config import ConfigError


def resolve_device(spec: str) -> torch.device:
    """``placement.device`` -> a concrete device (``auto``: CUDA when present, else the CPU)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"placement.device={spec} but torch sees no CUDA device (torch "
                f"{torch.__version__}); use placement.device=cpu or auto, or install a CUDA build"
            )
        index = int(spec.split(":")[1]) if ":" in spec else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"placement.device={spec} but only {torch.cuda.device_count()} CUDA device(s) "
                "exist; pick an index below that"
            )
    return torch.device(spec)


def rollout_dtype(spec: str, device: torch.device | str | None) -> str:
    """``rollout.dtype`` -> a dtype name (``auto``: bfloat16 on CUDA, float32 elsewhere)."""
    if spec != "auto":
        return spec
    return "bfloat16" if torch.device(device or "cpu").type == "cuda" else "float32"
