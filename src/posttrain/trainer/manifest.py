"""The content manifest of a checkpoint: what a checkpoint must hold, byte for byte.

``manifest.json`` lists every file of the checkpoint (relative path, size, SHA-256), and the
``COMPLETE`` marker, written last, holds the step and the SHA-256 of the manifest itself. A
checkpoint verifies when the marker, the manifest, every listed file and ``meta.json``'s step
all agree; anything else (a truncated file, flipped bytes, a hand-edited ``meta.json``, a
directory that pruning had begun to remove) fails with the reason, so resume can fall back to an
older checkpoint instead of loading damaged state.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posttrain.trainer.errors import CheckpointError

MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory does not verify against its manifest."""


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path, step: int) -> None:
    """Hash every file under ``directory`` into the manifest, then write the ``COMPLETE`` marker."""
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in (MANIFEST, COMPLETE)
    }
    body = json.dumps({"step": step, "files": files}, indent=1, sort_keys=True).encode()
    (directory / MANIFEST).write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    (directory / COMPLETE).write_text(f"{step}\n{digest}\n")


def verify(directory: Path, step: int) -> dict[str, Any]:
    """Check ``directory`` (checkpoint ``step``) against its manifest; return its ``meta.json``."""

    def bad(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint {directory} does not verify: {reason}")

    marker = directory / COMPLETE
    if not marker.is_file():
        raise bad(f"no {COMPLETE} marker (an interrupted save or prune)")
    lines = marker.read_text(errors="replace").split()
    if len(lines) != 2 or lines[0] != str(step):
        raise bad(f"{COMPLETE} does not name step {step} and a manifest hash")
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise bad(f"no {MANIFEST}")
    body = manifest_path.read_bytes()
    if hashlib.sha256(body).hexdigest() != lines[1]:
        raise bad(f"{MANIFEST} does not match the hash in {COMPLETE}")
    files = json.loads(body)["files"]
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise bad(f"{name} is missing")
        if path.stat().st_size != entry["size"]:
            raise bad(f"{name} has {path.stat().st_size} bytes, the manifest says {entry['size']}")
        if file_sha256(path) != entry["sha256"]:
            raise bad(f"{name} does not match its SHA-256 in the manifest (damaged bytes)")
    if "meta.json" not in files:
        raise bad("the manifest lists no meta.json")
    meta = json.loads((directory / "meta.json").read_text())
    if meta.get("step") != step:
        raise bad(f"meta.json says step {meta.get('step')!r}, the directory is step {step}")
    return meta
