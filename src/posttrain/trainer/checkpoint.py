"""Atomic checkpoints, keep-last-K, and resume (auto / off / must).

Layout of ``root/step_00000042/``::

    model/           Hugging Face layout: config.json + model.safetensors (from_pretrained works)
    trainer.pt       optimizer, scheduler and trainer counters (torch.save, weights_only-loadable)
    data_state.pt    the caller's data cursor (tensors and plain values)
    rng_rank{r}.pt   python / numpy / torch RNG state of rank r
    meta.json        step, world size, objective identity, resolved config
    manifest.json    size and SHA-256 of every file above
    dcp/             (sharded trainers only) weights + optimizer state, one file per rank;
                     ``model/`` then holds only the config and tokenizer (see ``dcp.py``)
    COMPLETE         written last: the step and the manifest's SHA-256

Everything is written into ``root/.tmp-step_00000042`` first, fsynced, then renamed: a crash
leaves either the previous checkpoints untouched or a temp/incomplete directory. Resume verifies
a checkpoint against its manifest before loading anything and walks back from the newest to the
newest one that verifies, warning about each one it skips (and moving it aside as
``.corrupt-step_*``). Pruning removes a checkpoint's ``COMPLETE`` marker before its files.
The manager assumes its caller owns the run directory (the run lock): resume deletes the temp
directories of an interrupted save, the next prune the marker-less remains of an interrupted one.
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

from posttrain.fileio import fsync_dir
from posttrain.trainer import dcp as dcp_io
from posttrain.trainer import distributed as dp
from posttrain.trainer.compat import RESUME_MUTABLE_KEYS, check_resume_compatible, resume_notes
from posttrain.trainer.core import Trainer
from posttrain.trainer.errors import CheckpointError, PoisonedStateError, ResumeError
from posttrain.trainer.manifest import COMPLETE, CorruptCheckpointError, verify, write_manifest
from posttrain.trainer.model_io import load_model_dir, save_model_dir
from posttrain.trainer.rng import get_rng_state, set_rng_state
from posttrain.trainer.save_errors import write_failure

FORMAT_VERSION = 2
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
        fsync_dir(dirpath)


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
        """``(step, path)`` of each step directory with a ``COMPLETE`` marker, oldest first
        (not verified: for naming what a run directory holds)."""
        return [(step, path) for step, path in self._step_dirs() if (path / COMPLETE).is_file()]

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
        """Write checkpoint ``step`` atomically; every data-parallel rank must call it.

        A failed or interrupted save removes its temp directory; the earlier checkpoints are
        untouched either way. A full disk becomes a :class:`CheckpointError` saying so.
        """
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        config = _jsonable(config, "config")
        identity = _jsonable(trainer.objective.identity, "objective identity")
        _refuse_poisoned(trainer)
        name = f"step_{step:08d}"
        final, tmp = self.root / name, self.root / f".tmp-{name}"
        try:
            self._write(step, tmp, final, trainer, config, identity, data_state, tokenizer)
        except BaseException as e:
            error = write_failure(e, step, self.root, tmp, final)
            if dp.rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            if error is None:
                raise
            raise error from e
        return final

    def _write(self, step, tmp, final, trainer, config, identity, data_state, tokenizer) -> None:
        rank = dp.rank()
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        dp.barrier()
        torch.save(get_rng_state(), tmp / f"rng_rank{rank}.pt")
        sharded = getattr(trainer, "sharded", False)
        if sharded:  # every rank writes its shards
            dcp_io.save_sharded(tmp, trainer, tokenizer)
        if rank == 0:
            if not sharded:
                save_model_dir(trainer.model, tmp / "model", tokenizer)
            torch.save(trainer.state_dict(optimizer=not sharded), tmp / "trainer.pt")
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
            write_manifest(tmp, step)
            _fsync_tree(tmp)
            if final.exists():
                trash = self.root / f".trash-{final.name}"
                os.rename(final, trash)
                os.rename(tmp, final)
                shutil.rmtree(trash)
            else:
                os.rename(tmp, final)
            fsync_dir(self.root)
            self._prune()
        dp.barrier()

    def _prune(self) -> None:
        """After a save: remove step directories without a marker (a prune that was stopped;
        a save only ever renames complete ones into place), then all but the newest K."""
        for _, path in self._step_dirs():
            if not (path / COMPLETE).exists():
                shutil.rmtree(path)
        if self.keep_last == 0:
            return
        for _, path in self._step_dirs()[: -self.keep_last]:
            # Marker first: a prune killed midway leaves a directory that is visibly incomplete.
            (path / COMPLETE).unlink()
            fsync_dir(path)
            shutil.rmtree(path)

    # -- load / resume ---------------------------------------------------------------------
    def load(
        self, path: str | os.PathLike, trainer: Trainer, *, config: Mapping[str, Any]
    ) -> ResumeState:
        """Verify ``path`` against its manifest, check compatibility, then restore model, trainer
        state and this rank's RNG. Nothing is loaded from a checkpoint that does not verify."""
        path = Path(path)
        m = _STEP_DIR.match(path.name)
        if not m:
            raise CheckpointError(f"{path} is not a checkpoint directory (step_NNNNNNNN)")
        return self._load_verified(path, verify(path, int(m.group(1))), trainer, config)

    def _load_verified(
        self, path: Path, meta: dict[str, Any], trainer: Trainer, config: Mapping[str, Any]
    ) -> ResumeState:
        """:meth:`load` once ``path`` has verified (``meta`` is what verification read)."""
        if meta.get("format_version") != FORMAT_VERSION:
            raise CorruptCheckpointError(
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
        for note in resume_notes(meta["config"], config):
            warnings.warn(f"resuming from {path}: {note}", stacklevel=2)
        rank = dp.rank()
        sharded = dcp_io.is_sharded_checkpoint(path)
        refuse_unloadable(path, getattr(trainer, "sharded", False))
        device = trainer.device
        if sharded:
            dcp_io.load_sharded(path, trainer)
        else:
            load_model_dir(trainer.model, path / "model")
        trainer.load_state_dict(
            torch.load(path / "trainer.pt", map_location=device, weights_only=True)
        )
        data_state = torch.load(path / "data_state.pt", weights_only=True)
        rng = path / f"rng_rank{rank}.pt"
        if rng.exists():
            set_rng_state(torch.load(rng, weights_only=True))
        else:  # a sharded checkpoint resumed on more ranks than wrote it
            warnings.warn(
                f"{path} holds no RNG state for rank {rank}; it keeps its own", stacklevel=2
            )
        return ResumeState(path, int(meta["step"]), data_state, meta["config"])

    def resume(
        self, trainer: Trainer, *, mode: str, config: Mapping[str, Any]
    ) -> ResumeState | None:
        """Apply a resume mode; returns the loaded state, or None when starting fresh.

        ``auto``: the newest checkpoint that verifies, else fresh when there is none at all.
        ``must``: the newest checkpoint that verifies, or an error. Either way, checkpoints that
        exist but do not verify are skipped with a warning and moved aside; if all of them fail,
        resume stops rather than silently restart the run. ``off``: fresh, and an error if
        ``root`` already holds another run's checkpoints (starting over would interleave them).
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
        if dp.rank() == 0:
            self._remove_leftovers()
        dp.barrier()
        candidates = self._step_dirs()
        skipped: list[Path] = []
        chosen = meta = None
        for step, path in reversed(candidates):
            meta = self.verified(path, step)  # hashes every file once; loading reuses the result
            if meta is not None:
                chosen = path
                break
            skipped.append(path)
        dp.barrier()
        if dp.rank() == 0:
            for path in skipped:
                self.set_aside(path)
        if chosen is None:
            if skipped:
                raise ResumeError(
                    f"rl.resume={mode}: none of the {len(skipped)} checkpoints under {self.root} "
                    "verifies (moved aside as .corrupt-step_*); start over under a new job.name, "
                    "or delete that directory"
                )
            if mode == "must":
                raise ResumeError(f"rl.resume=must but {self.root} holds no complete checkpoint")
            return None
        return self._load_verified(chosen, meta, trainer, config)

    def _remove_leftovers(self) -> None:
        """Delete the temp and trash directories an interrupted save left behind."""
        if not self.root.is_dir():
            return
        for p in sorted(self.root.glob(".tmp-step_*")) + sorted(self.root.glob(".trash-step_*")):
            warnings.warn(
                f"removing half-written checkpoint {p} (an interrupted save)", stacklevel=3
            )
            shutil.rmtree(p)

    def verified(self, path: Path, step: int) -> dict[str, Any] | None:
        """``path``'s meta when its bytes match its manifest; else None, with a warning that it
        is skipped (the caller moves it aside with :meth:`set_aside`)."""
        try:
            return verify(path, step)
        except CorruptCheckpointError as e:
            warnings.warn(f"{e}; skipping it and trying an older checkpoint", stacklevel=3)
            return None

    def set_aside(self, path: Path) -> None:
        """Move a checkpoint that does not verify aside as ``.corrupt-step_*`` (with a warning):
        never deleted, never again a resume candidate."""
        target = self.root / f".corrupt-{path.name}"
        n = 1
        while target.exists():
            n += 1
            target = self.root / f".corrupt-{path.name}.{n}"
        os.rename(path, target)
        warnings.warn(f"moved the damaged checkpoint {path} aside to {target}", stacklevel=3)


def refuse_unloadable(path: Path, sharded_run: bool) -> None:
    """What resharding cannot do, in one line. A sharded checkpoint (DCP) loads into any number
    of sharded ranks or into replicated ones (DCP reshards); a replicated one (every rank held
    the same weights and optimizer state, rank 0 wrote them) into any number of replicated
    ranks. Only a replicated checkpoint into sharded ranks is refused: its optimizer state is
    keyed by position in one unsharded model, which FSDP's sharded optimizer cannot take."""
    if sharded_run and not dcp_io.is_sharded_checkpoint(path):
        raise ResumeError(
            f"{path} is a replicated checkpoint (written with placement.policy_sharding=none) "
            "and cannot be resharded; resume it with placement.policy_sharding=none (any "
            "placement.policy_ranks), or start a new sharded run under another job.name from "
            "its model/ folder (model.name_or_path)"
        )


def _refuse_poisoned(trainer: Trainer) -> None:
    if getattr(trainer, "sharded", False):
        dcp_io.refuse_poisoned(trainer)
        return
    for name, p in trainer.model.named_parameters():
        if not torch.isfinite(p).all():
            raise PoisonedStateError(f"refusing to save: parameter {name} holds NaN or inf")
    for i, state in enumerate(trainer.optimizer.state.values()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not torch.isfinite(value).all():
                raise PoisonedStateError(
                    f"refusing to save: optimizer state {key} of param #{i} holds NaN or inf"
                )
