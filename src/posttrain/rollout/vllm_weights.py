"""The weight receiver of ``rollout.engine=vllm``: what a sync hands vLLM's process.

Full weights: each bucket becomes an HF-named safetensors file in a RAM folder (``/dev/shm``),
and ``end`` asks vLLM to ``reload_weights`` from it (the process then repacks the tied
``lm_head`` and drops the prefix cache). With LoRA enabled (``vllm.lora_sync=adapter``): the
adapters alone, written at ``end`` as a peft folder and loaded as the next adapter version.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from posttrain.rollout.vllm_process import NAME

if TYPE_CHECKING:
    from posttrain.rollout.vllm_engine import VllmRolloutEngine


def _shm_dir() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def weight_names(model: nn.Module) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every state-dict name of ``model`` -> (its canonical name, its shape); tied tensors map to
    the first name of their parameter (by identity, so a meta-device skeleton works too)."""
    first: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not t.numel():
            continue
        out[name] = (first.setdefault(id(t), name), tuple(t.shape))
    return out


def adapted_of(model: nn.Module, targets: Sequence[str]) -> frozenset[str]:
    """The modules peft adapts for ``targets`` (plain names), which vLLM's LoRA path must find
    in every sync."""
    from posttrain.placement.weight_sync import adapted_modules

    modules = frozenset(adapted_modules(model, targets))
    if not modules:
        raise ValueError(
            f"{NAME}: model.lora_target_modules={list(targets)} names no linear module of the model"
        )
    return modules


class VllmWeights:
    """The engine's weight receiver: buckets become safetensors files; ``end`` reloads them.
    On an engine with LoRA enabled it takes adapters alone, and ``end`` loads them as the next
    adapter version."""

    def __init__(self, engine: VllmRolloutEngine) -> None:
        self._engine = engine
        self._dir: str | None = None
        self._sent: set[str] = set()
        self._files = 0
        self._adapters: dict[str, Tensor] = {}

    def names(self) -> dict[str, str]:
        return {k: canonical for k, (canonical, _) in self._engine.weights.items()}

    def adapter_modules(self) -> frozenset[str] | None:
        """The adapted modules whose ``.lora_A`` / ``.lora_B`` this engine takes as they are
        (None: full weights only)."""
        return self._engine.adapted

    def begin(self) -> None:
        """Open a staging folder for this sync (RAM-backed where ``/dev/shm`` is writable)."""
        self._discard()
        self._dir = tempfile.mkdtemp(prefix="posttrain-vllm-sync-", dir=_shm_dir())

    def load(self, weights: Mapping[str, Tensor]) -> None:
        """Check the names and shapes, then write the bucket as one safetensors file (adapters:
        keep them for ``end``, which writes them as one adapter)."""
        from safetensors.torch import save_file

        if self._engine.adapted is not None:
            self._keep_adapters(weights)
            return
        table = self._engine.weights
        for name, value in weights.items():
            entry = table.get(name)
            if entry is None or entry[1] != tuple(value.shape):
                have = "no such weight" if entry is None else f"shape {entry[1]}"
                raise ValueError(
                    f"sync_weights: {name!r} {tuple(value.shape)} does not fit the engine's "
                    f"model ({have}); send the policy's weights under the model's own names"
                )
        if self._dir is None:
            self.begin()
        bucket = {}
        for name, value in weights.items():
            canonical = table[name][0]
            if canonical not in self._sent:  # a tied weight is written once, under its owner
                self._sent.add(canonical)
                bucket[canonical] = value.detach().to("cpu").contiguous()
        if bucket:
            assert self._dir is not None
            save_file(bucket, os.path.join(self._dir, f"bucket-{self._files:05d}.safetensors"))
            self._files += 1

    def _keep_adapters(self, weights: Mapping[str, Tensor]) -> None:
        adapted, table = self._engine.adapted, self._engine.weights
        rank = self._engine.options.lora_rank
        assert adapted is not None
        for name, value in weights.items():
            module, _, kind = name.rpartition(".")
            if kind not in ("lora_A", "lora_B") or module not in adapted:
                raise ValueError(
                    f"sync_weights: {name!r} is not an adapter of this engine's LoRA modules "
                    f"({len(adapted)}); {NAME} with vllm.lora_sync=adapter takes the policy's "
                    "adapters alone (vllm.lora_sync=merged takes full weights)"
                )
            out, inp = table[f"{module}.weight"][1]
            want = (rank, inp) if kind == "lora_A" else (out, rank)
            if tuple(value.shape) != want:
                raise ValueError(
                    f"sync_weights: {name!r} {tuple(value.shape)} is not the shape of a rank-"
                    f"{rank} adapter of that module {want}; the policy and the engine disagree "
                    "on model.lora_rank"
                )
            self._adapters[name] = value.detach().to("cpu", torch.float32).contiguous()

    def _load_adapters(self) -> None:
        """The adapters as a peft folder in the engine's work folder, loaded as the next
        version; the previous version's folder goes once vLLM has let it go."""
        from safetensors.torch import save_file

        engine = self._engine
        adapted = engine.adapted
        assert adapted is not None
        missing = sorted(
            f"{m}{k}" for m in adapted for k in (".lora_A", ".lora_B")
            if f"{m}{k}" not in self._adapters
        )  # fmt: skip
        if missing:
            raise ValueError(
                f"weight sync: {len(missing)} adapter(s) did not arrive (first: {missing[0]}); "
                f"{NAME} loads every adapted module's adapters at once"
            )
        version = engine.weight_version + 1
        folder = Path(engine.process.workdir) / f"lora-{version:06d}"
        folder.mkdir()
        tensors = {f"base_model.model.{k}.weight": v for k, v in self._adapters.items()}
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        o = engine.options
        (folder / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": o.lora_rank,
            "lora_alpha": o.lora_alpha, "target_modules": sorted(o.lora_targets),
            "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
        }))  # fmt: skip
        spec = (f"posttrain-v{version}", version, str(folder))
        try:
            engine.last_reload_s = float(engine.process.call("lora", lora=spec)["seconds"])
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if engine.lora is not None:
            shutil.rmtree(engine.lora[2], ignore_errors=True)
        engine.lora = spec

    def end(self) -> int:
        """Every weight arrived: vLLM reloads them (then repacks ``lm_head``, resets its prefix
        cache), or loads the adapters as the next version; the staging folder goes, the weight
        version moves on once."""
        try:
            if self._engine.adapted is not None:
                self._load_adapters()
            elif self._files:
                expected = {c for c, _ in self._engine.weights.values()}
                missing = sorted(expected - self._sent)
                if missing:
                    raise ValueError(
                        f"weight sync: {len(missing)} weight(s) did not arrive (first: "
                        f"{missing[0]}); {NAME} reloads full weights only"
                    )
                self._engine.last_reload_s = float(
                    self._engine.process.call("reload", path=self._dir)["seconds"]
                )
        finally:
            self._discard()
        self._engine.weight_version += 1
        return self._engine.weight_version

    def _discard(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir, self._sent, self._files, self._adapters = None, set(), 0, {}
