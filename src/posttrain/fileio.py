"""Crash-safe file writes: a reader sees the old file or the new one, never a torn mix.

Every file a run rewrites goes through :func:`atomic_write_text`: the bytes go to a temp file
beside the target, are fsynced, the temp file is renamed over the target and the directory is
fsynced, so a kill at any point leaves the previous content in place. A failed write (a full
disk) removes its temp file before the error propagates. A folder of files written together
(``posttrain rft``'s rows, pairs and summary) goes through :func:`write_files_as_folder`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
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


def write_files_as_folder(
    out: str | os.PathLike, files: dict[str, str], before_replace: Callable[[], None] = lambda: None
) -> None:
    """Write ``files`` (name -> text) into a temporary folder beside ``out``, fsynced, and
    rename it to ``out``; an existing ``out`` is first moved aside and removed after, so a
    reader sees the old folder or the new one, never a mix (between the two renames, none).
    ``before_replace`` runs just before: it may refuse (raise) and nothing changes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}.", dir=out.parent))
    old = None
    try:
        for name, text in files.items():
            with open(tmp / name, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        before_replace()
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{out.name}.", dir=out.parent))
            os.rename(out, old / out.name)
        os.rename(tmp, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
