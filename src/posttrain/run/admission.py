"""What a command may do with the run directory it resolves to, decided before any model loads.

Built-in recipes have fixed ``job.name``s, so documented commands meet each other's run
directories. Before this module, such a meeting went wrong quietly ("trained -2500 steps",
a history wiped by a rerun whose checkpoints were gone). Now each case is decided up front, from
what the directory already holds (its ``config.yaml``, its newest complete checkpoint's
``meta.json``, its data fingerprints in ``inputs.json``):

================================  ==============================================================
the directory holds               the command
================================  ==============================================================
nothing                           starts at step 0
a checkpoint, same config         resumes ("resuming from step N (checkpoint ...)"), or, asked for
                                  no more steps than done, says "already complete at step N"
a checkpoint, different config,   is refused in one line naming the keys / the step; nothing in
fewer steps, or changed data      the directory changes (``config.yaml`` stays as it was)
records but no checkpoint,        restarts at step 0 and moves the old records aside (one line)
same config
records but no checkpoint,        is refused in one line, unless ``rl.resume=off`` asks for a
different config                  fresh start explicitly: then the old records are moved aside
================================  ==============================================================

"Same config" means equal up to the keys resume allows to change (``RESUME_MUTABLE_KEYS``).
The policy role's own resume still verifies the checkpoint byte for byte and compares the
objective identity; this is the cheap, early half that needs no model.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig, to_dict
from posttrain.config.serialize import parse_yaml
from posttrain.fileio import atomic_write_text
from posttrain.run.fingerprint import changed_inputs, fingerprints
from posttrain.trainer.checkpoint import CheckpointManager, refuse_unloadable
from posttrain.trainer.compat import RESUME_MUTABLE_KEYS, check_resume_compatible, differing_keys
from posttrain.trainer.errors import ResumeError

log = logging.getLogger("posttrain")

CONFIG_RECORD = "config.yaml"
INPUTS_RECORD = "inputs.json"
#: Entries of a run directory that are not the run's records.
NOT_RECORDS = (".lock", "checkpoints")
ASIDE_PREFIX = ".previous-"


@dataclass(frozen=True)
class Admission:
    """The decision: ``start`` is the step the run continues from (0: fresh), ``checkpoint`` the
    checkpoint it resumes from, ``complete`` whether there is nothing left to train."""

    start: int = 0
    checkpoint: Path | None = None
    complete: bool = False


def admit(config: PosttrainConfig, run_dir: Path) -> Admission:
    """Decide what this command does with ``run_dir`` (see the module docstring); refusals are
    :class:`ResumeError` lines that say what to do. The caller holds the run lock."""
    mode, current = config.rl.resume, to_dict(config)
    if mode == "off" and CheckpointManager(run_dir / "checkpoints").has_any():
        raise ResumeError(
            f"rl.resume=off but {run_dir} already holds checkpoints of an earlier run; start "
            "this one under another job.name, or drop rl.resume=off to continue that run"
        )
    newest = _verified_if_final(config, run_dir / "checkpoints")
    if newest is not None:
        step, path, meta = newest
        check_resume_compatible(str(path), {}, {}, meta["config"], current, RESUME_MUTABLE_KEYS)
        refuse_unloadable(path, config.placement.policy_sharding == "fsdp")
        _refuse_changed_inputs(config, run_dir, path)
        if config.rl.max_steps < step:
            raise ResumeError(
                f"rl.max_steps={config.rl.max_steps} is below step {step}, where the run in "
                f"{run_dir} already is (checkpoint {path}); pass rl.max_steps={step} or more to "
                "continue it, or start a new run under another job.name"
            )
        return Admission(step, path, complete=config.rl.max_steps == step)
    if mode == "must":
        raise ResumeError(
            f"rl.resume=must but {run_dir / 'checkpoints'} holds no complete checkpoint"
        )
    records = run_records(run_dir)
    if records:
        if mode != "off":
            _refuse_other_run(run_dir, records, current)
        aside = move_aside(run_dir, records)
        why = "rl.resume=off" if mode == "off" else "no checkpoint of this config"
        log.warning(
            "%s held records of an earlier run but %s: starting from step 0, the old records "
            "(%s) moved to %s",
            run_dir, why, ", ".join(records), aside,
        )  # fmt: skip
    return Admission()


def record_inputs(config: PosttrainConfig, run_dir: Path) -> None:
    """Fingerprint the data files a fresh run reads (resume compares against them)."""
    atomic_write_text(
        run_dir / INPUTS_RECORD, json.dumps(fingerprints(config), indent=1, sort_keys=True) + "\n"
    )


def newest_checkpoint(root: Path) -> tuple[int, Path, dict[str, Any]] | None:
    """The newest step directory with a ``COMPLETE`` marker and a readable ``meta.json``
    (resume verifies its bytes later; this is only for the early decisions)."""
    for step, path in reversed(CheckpointManager(root).complete()):
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
            return step, path, meta
    return None


def _verified_if_final(
    config: PosttrainConfig, root: Path
) -> tuple[int, Path, dict[str, Any]] | None:
    """:func:`newest_checkpoint`, verified byte for byte when it is the run's last step: a
    finished run loads no policy (whose resume would verify it and fall back), so a damaged
    final checkpoint is set aside here, as resume does, and the one before it decides."""
    newest = newest_checkpoint(root)
    if newest is None or newest[0] != config.rl.max_steps:
        return newest  # an unfinished run: resume verifies it when the policy loads
    manager = CheckpointManager(root)
    if manager.verified(newest[1], newest[0]) is not None:
        return newest
    manager.set_aside(newest[1])
    older = newest_checkpoint(root)
    if older is None:
        raise ResumeError(
            f"the final checkpoint under {root} does not verify (moved aside as "
            ".corrupt-step_*) and no earlier one is left; start over under a new job.name, "
            "or delete that directory"
        )
    return older


def run_records(run_dir: Path) -> list[str]:
    """Names of what an earlier run left in ``run_dir`` besides checkpoints and the lock."""
    if not run_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in run_dir.iterdir()
        if p.name not in NOT_RECORDS and not p.name.startswith(ASIDE_PREFIX)
    )


def move_aside(run_dir: Path, names: list[str]) -> Path:
    """Move ``names`` into a fresh ``.previous-N`` folder of ``run_dir``, one rename each."""
    n = 1
    while (run_dir / f"{ASIDE_PREFIX}{n}").exists():
        n += 1
    aside = run_dir / f"{ASIDE_PREFIX}{n}"
    aside.mkdir()
    for name in names:
        os.rename(run_dir / name, aside / name)
    return aside


def _refuse_other_run(run_dir: Path, records: list[str], current: dict[str, Any]) -> None:
    try:
        saved = parse_yaml((run_dir / CONFIG_RECORD).read_text())
    except (OSError, ValueError):
        saved = None
    what = f"holds records ({', '.join(records)}) but no checkpoint"
    fix = (
        "start this one under another job.name, or pass rl.resume=off to start over there "
        "(the old records are moved aside, not deleted)"
    )
    if not isinstance(saved, dict):
        raise ResumeError(f"{run_dir} {what} and no readable {CONFIG_RECORD}; {fix}")
    keys = differing_keys(saved, current, RESUME_MUTABLE_KEYS)
    if keys:
        shown = ", ".join(keys[:6]) + (f" (+{len(keys) - 6} more)" if len(keys) > 6 else "")
        raise ResumeError(f"{run_dir} {what} of a run whose config differs in {shown}; {fix}")


def _refuse_changed_inputs(config: PosttrainConfig, run_dir: Path, checkpoint: Path) -> None:
    path = run_dir / INPUTS_RECORD
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        warnings.warn(
            f"{run_dir} has no {INPUTS_RECORD} (a run from an older posttrain): the data files "
            "cannot be compared with the ones the run started on; recording them now",
            stacklevel=3,
        )
        record_inputs(config, run_dir)
        return
    except (OSError, ValueError):
        saved = {}
    changed = changed_inputs(saved, fingerprints(config))
    if changed:
        raise ResumeError(
            f"refusing to resume from {checkpoint}: {'; '.join(changed)} since the run started; "
            "restore the file to continue the run, or train on the new data under another "
            "job.name"
        )
