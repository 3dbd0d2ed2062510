"""Crash-safe file writes: a reader sees the old file or the new one, never a torn mix.

Every file a run rewrites goes through :func:`atomic_write_text`: the bytes go to a temp file
beside the target, are fsynced, the temp file is renamed over the target and the directory is
fsynced, so a kill at any point leaves the previous content in place. A failed write (a full
disk) removes its temp file before the error propagates.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Persist a directory entry change (a rename, a new or removed file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.filename is None:  # name the file a full disk or a permission stopped
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
