"""Where a local run's model-bearing roles live, and in which dtype the rollout samples.

``rollout.dtype=auto`` is bfloat16 where the hardware computes bf16 matmuls natively (a CUDA
device with bf16, a CPU with AMX-BF16 or AVX512-BF16) and float32 elsewhere. The CPU's features
are read, not guessed: torch's own cpuinfo probe where this torch has it, else ``/proc/cpuinfo``.
torch is imported inside the functions, so preflight can resolve a dtype without loading it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.config import ConfigError

if TYPE_CHECKING:
    import torch

#: CPU features whose bf16 dot products make a bf16 matmul faster than a float32 one.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def resolve_device(spec: str) -> torch.device:
    """``placement.device`` -> a concrete device (``auto``: CUDA when present, else the CPU)."""
    import torch

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


def _torch_cpu_capability() -> Mapping[str, object]:
    """torch's cpuinfo probe (a private API: an empty mapping where this build lacks it). Read
    only when torch is loaded already or ``/proc/cpuinfo`` is missing (not Linux)."""
    if "torch" not in sys.modules and Path("/proc/cpuinfo").exists():
        return {}
    import torch

    probe = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    try:
        found = probe() if probe is not None else {}
    except RuntimeError:
        found = {}
    return found if isinstance(found, Mapping) else {}


def _proc_cpuinfo_flags(path: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = path.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_bf16_flags(
    capability: Mapping[str, object] | None = None, cpuinfo: set[str] | None = None
) -> tuple[str, ...]:
    """The CPU's bf16 matmul features (of :data:`CPU_BF16_FLAGS`) that torch's probe or
    ``/proc/cpuinfo`` reports; the arguments inject either source (tests)."""
    capability = _torch_cpu_capability() if capability is None else capability
    cpuinfo = _proc_cpuinfo_flags() if cpuinfo is None else cpuinfo
    return tuple(f for f in CPU_BF16_FLAGS if capability.get(f) is True or f in cpuinfo)


def bf16_hardware(device: torch.device | str | None) -> str | None:
    """Why ``device`` computes bf16 matmuls natively (for the placement log line), or None."""
    kind = getattr(device, "type", None) or str(device or "cpu").split(":")[0]
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():  # preflight on a machine without the GPU it targets
            return "CUDA (assumed to have bf16: no device visible to check)"
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return f"{torch.cuda.get_device_name()} has bf16" if native else None
    if kind == "cpu":
        flags = cpu_bf16_flags()
        return f"the CPU has {' and '.join(flags)}" if flags else None
    return None


def rollout_dtype(
    spec: str,
    device: torch.device | str | None,
    hardware: Callable[[torch.device | str | None], str | None] = bf16_hardware,
) -> str:
    """``rollout.dtype`` -> a dtype name (``auto``: bfloat16 where ``hardware`` says the device
    has native bf16 matmuls, else float32)."""
    return rollout_dtype_and_why(spec, device, hardware)[0]


def rollout_dtype_and_why(
    spec: str,
    device: torch.device | str | None,
    hardware: Callable[[torch.device | str | None], str | None] = bf16_hardware,
) -> tuple[str, str]:
    """The dtype and, for ``auto``, why it was chosen (``""`` when the config named it)."""
    if spec != "auto":
        return spec, ""
    why = hardware(device)
    if why is not None:
        return "bfloat16", f"auto: {why}"
    return "float32", "auto: no native bf16 matmuls on this device"
