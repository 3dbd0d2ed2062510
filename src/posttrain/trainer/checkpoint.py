"""Atomic checkpoints, keep-last-K, and resume (auto / off / must).

Layout of ``root/step_00000042/``::

    model/           Hugging Face layout: config.json + model.safetensors (from_pretrained works)
    trainer.pt       optimizer, scheduler and trainer counters (torch.save, weights_only-loadable)
    data_state.pt    the caller's data cursor (tensors and plain values)
    rng_rank{r}.pt   python / numpy / torch RNG state of rank r
    meta.json        step, world size, objective identity, resolved config
    COMPLETE         written last: a directory without it is ignored with a warning

Everything is written into ``root/.tmp-step_00000042`` first, fsynced, then renamed: a crash
leaves either the previous checkpoints untouched or a temp/incomplete directory we skip.
Only ``torch.load(weights_only=True)`` is ever used to read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.trainer import distributed as dp
from posttrain.trainer.compat import RESUME_MUTABLE_KEYS, check_resume_compatible
from posttrain.trainer.core import Trainer
from posttrain.trainer.errors import CheckpointError, PoisonedStateError, ResumeError
from posttrain.trainer.model_io import load_model_dir, save_model_dir
from posttrain.trainer.rng import get_rng_state, set_rng_state

FORMAT_VERSION = 1
COMPLETE = "COMPLETE"
RESUME_MODES = ("auto", "off", "must")
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


@dataclass(frozen=True)
class ResumeState:
    """What a loaded checkpoint hands back to the loop (model and trainer are already restored)."""

    path: Path
    step: int
    data_state: Any
    config: dict[str, Any]


def _jsonable(value: Mapping[str, Any], what: str) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(dict(value), sort_keys=True))
    except TypeError as e:
        raise ValueError(
            f"{what} must be JSON-serialisable for checkpoint provenance: {e}"
        ) from None


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves and finds checkpoints of one run under ``root`` (one directory per job.name)."""

    def __init__(
        self,
        root: str | os.PathLike,
        keep_last: int = 3,
        allowed_config_changes: Iterable[str] = RESUME_MUTABLE_KEYS,
    ) -> None:
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps every checkpoint), got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.allowed_config_changes = tuple(allowed_config_changes)

    # -- discovery -------------------------------------------------------------------------
    def _step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def complete(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first; incomplete ones are skipped with a warning."""
        out = []
        for step, path in self._step_dirs():
            if (path / COMPLETE).exists():
                out.append((step, path))
            else:
                warnings.warn(
                    f"ignoring incomplete checkpoint {path} (no {COMPLETE} marker)", stacklevel=2
                )
        for tmp in sorted(self.root.glob(".tmp-step_*")) if self.root.is_dir() else []:
            warnings.warn(
                f"ignoring half-written checkpoint {tmp} (left by an interrupted save)",
                stacklevel=2,
            )
        return out

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1][1] if done else None

    def has_any(self) -> bool:
        """Whether ``root`` already holds checkpoint files of some run (complete or not)."""
        return self.root.is_dir() and (
            bool(self._step_dirs()) or any(self.root.glob(".tmp-step_*"))
        )

    # -- save ------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        trainer: Trainer,
        *,
        config: Mapping[str, Any],
        data_state: Any = None,
        tokenizer: object | None = None,
    ) -> Path:
        """Write checkpoint ``step`` atomically; every data-parallel rank must call it."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        config = _jsonable(config, "config")
        identity = _jsonable(trainer.objective.identity, "objective identity")
        _refuse_poisoned(trainer)
        name = f"step_{step:08d}"
        final, tmp = self.root / name, self.root / f".tmp-{name}"
        rank = dp.rank()
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        dp.barrier()
        torch.save(get_rng_state(), tmp / f"rng_rank{rank}.pt")
        if rank == 0:
            save_model_dir(trainer.model, tmp / "model", tokenizer)
            torch.save(trainer.state_dict(), tmp / "trainer.pt")
            torch.save(data_state, tmp / "data_state.pt")
            meta = {
                "format_version": FORMAT_VERSION,
                "step": step,
                "world_size": dp.world_size(),
                "objective_identity": identity,
                "config": config,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        dp.barrier()
        if rank == 0:
            (tmp / COMPLETE).write_text(f"{step}\n")
            _fsync_tree(tmp)
            if final.exists():
                trash = self.root / f".trash-{name}"
                os.rename(final, trash)
                os.rename(tmp, final)
                shutil.rmtree(trash)
            else:
                os.rename(tmp, final)
            _fsync_dir(self.root)
            self._prune()
        dp.barrier()
        return final

    def _prune(self) -> None:
        if self.keep_last == 0:
            return
        done = [(s, p) for s, p in self._step_dirs() if (p / COMPLETE).exists()]
        for _, path in done[: -self.keep_last]:
            shutil.rmtree(path)

    # -- load / resume ---------------------------------------------------------------------
    def load(
        self, path: str | os.PathLike, trainer: Trainer, *, config: Mapping[str, Any]
    ) -> ResumeState:
        """Restore model, trainer state and this rank's RNG from ``path`` after compat checks."""
        path = Path(path)
        if not (path / COMPLETE).exists():
            raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format {meta.get('format_version')} is not {FORMAT_VERSION}"
            )
        check_resume_compatible(
            str(path),
            meta["objective_identity"],
            _jsonable(trainer.objective.identity, "objective identity"),
            meta["config"],
            _jsonable(config, "config"),
            self.allowed_config_changes,
        )
        rank = dp.rank()
        if meta["world_size"] != dp.world_size():
            raise ResumeError(
                f"{path} was written by {meta['world_size']} data-parallel ranks, this run has "
                f"{dp.world_size()}; resume with the same number of ranks"
            )
        device = trainer.device
        load_model_dir(trainer.model, path / "model")
        trainer.load_state_dict(
            torch.load(path / "trainer.pt", map_location=device, weights_only=True)
        )
        data_state = torch.load(path / "data_state.pt", weights_only=True)
        set_rng_state(torch.load(path / f"rng_rank{rank}.pt", weights_only=True))
        return ResumeState(path, int(meta["step"]), data_state, meta["config"])

    def resume(
        self, trainer: Trainer, *, mode: str, config: Mapping[str, Any]
    ) -> ResumeState | None:
        """Apply a resume mode; returns the loaded state, or None when starting fresh.

        ``auto``: newest complete checkpoint if any, else fresh. ``must``: newest complete
        checkpoint or an error. ``off``: fresh, and an error if ``root`` already holds another
        run's checkpoints (starting over there would interleave two runs' files).
        """
        if mode not in RESUME_MODES:
            raise ValueError(f"resume mode must be one of {RESUME_MODES}, got {mode!r}")
        if mode == "off":
            if self.has_any():
                raise ResumeError(
                    f"resume=off but {self.root} already holds checkpoints of an earlier run; "
                    "pick a new job.name (a fresh output directory), delete that directory, or "
                    "use resume=auto to continue it"
                )
            return None
        latest = self.latest()
        if latest is None:
            if mode == "must":
                raise ResumeError(f"resume=must but {self.root} holds no complete checkpoint")
            return None
        return self.load(latest, trainer, config=config)


def _refuse_poisoned(trainer: Trainer) -> None:
    for name, p in trainer.model.named_parameters():
        if not torch.isfinite(p).all():
            raise PoisonedStateError(f"refusing to save: parameter {name} holds NaN or inf")
    for i, state in enumerate(trainer.optimizer.state.values()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not torch.isfinite(value).all():
                raise PoisonedStateError(
                    f"refusing to save: optimizer state {key} of param #{i} holds NaN or inf"
                )
