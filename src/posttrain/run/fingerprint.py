"""Fingerprints of the data files a run reads, so resume notices a file that changed under it.

The config names data files by path; replacing ``train.jsonl`` (1000 rows) with another file of
20 rows at the same path leaves the config equal, and a resumed run would continue a different
experiment silently. A fingerprint is the file's size and SHA-256; for a file over
:data:`FULL_HASH_LIMIT` bytes hashing it all at every start would cost seconds, so it is the
size, the modification time and the SHA-256 of its first :data:`HEAD_BYTES` bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig

#: Files up to this size are hashed whole.
FULL_HASH_LIMIT = 64 * 2**20
HEAD_BYTES = 2**20


def data_files(config: PosttrainConfig) -> dict[str, Path]:
    """The config keys that name a data file this run reads, and the files."""
    named = {
        "data.train_path": config.data.train_path,
        "data.val_path": config.data.val_path,
        "dpo.pairs_path": config.dpo.pairs_path,
    }
    return {k: Path(v) for k, v in named.items() if v is not None and Path(v).is_file()}


def fingerprint(path: Path) -> dict[str, Any]:
    stat = path.stat()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        if stat.st_size <= FULL_HASH_LIMIT:
            digest = hashlib.file_digest(f, "sha256")
            return {"path": str(path), "size": stat.st_size, "sha256": digest.hexdigest()}
        digest.update(f.read(HEAD_BYTES))
    return {
        "path": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "head_sha256": digest.hexdigest(),
    }


def fingerprints(config: PosttrainConfig) -> dict[str, dict[str, Any]]:
    return {key: fingerprint(path) for key, path in sorted(data_files(config).items())}


def changed_inputs(saved: dict[str, Any], current: dict[str, dict[str, Any]]) -> list[str]:
    """One phrase per data file whose fingerprint differs from the recorded one."""
    out = []
    for key in sorted(set(saved) & set(current)):
        before, now = saved[key], current[key]
        if before == now:
            continue
        if isinstance(before, dict) and before.get("size") != now["size"]:
            detail = f"{before.get('size')} -> {now['size']} bytes"
        else:
            detail = "same size, different content"
        out.append(f"{key} ({now['path']}) changed ({detail})")
    return out
