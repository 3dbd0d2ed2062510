"""One writer per run directory: an advisory lock file holding the writer's pid and host.

Two processes writing one run directory interleave checkpoints and duplicate metrics lines, so a
run takes ``<run_dir>/.lock`` with ``flock`` before it reads or writes anything there. The kernel
drops a flock when its holder dies (even by SIGKILL), so a lock file left by a dead run is free
to take: the new run takes it over and warns with the old holder's pid and host. A live holder
makes the new run refuse with one line naming it.

Caveat: ``flock`` is advisory and is only as good as the filesystem's support (local disks and
most modern network filesystems honour it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("posttrain")

LOCK_NAME = ".lock"


class RunLockedError(RuntimeError):
    """Another live process holds the run directory."""


class RunLock:
    """``with RunLock(run_dir):`` — hold the run directory for the duration of the block."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                raise RunLockedError(
                    f"run directory {self.path.parent} is in use by {self._holder()}; wait for "
                    "that run to finish or stop it, or start this one under another job.name"
                ) from None
            # A releasing holder unlinks the file: if ours is no longer the one at the path,
            # we locked a dead inode and must try again on the new file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = os.read(fd, 4096).decode("utf-8", "replace").strip()
        if stale:
            log.warning(
                "taking over the lock of %s: %s (that process is gone; it stopped without "
                "releasing the run directory)",
                self.path.parent,
                _describe(stale),
            )
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def _holder(self) -> str:
        try:
            return _describe(self.path.read_text(errors="replace"))
        except OSError:
            return "another process"


def _describe(text: str) -> str:
    try:
        info = json.loads(text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} on host {info['host']} (since {since})"
    except (ValueError, KeyError, TypeError):
        return f"an unknown process (lock file reads {text[:80]!r})"


def prepare_run_dir(run_dir: str | os.PathLike) -> Path:
    """Create the run directory; a path that cannot hold one is a one-line config error."""
    from posttrain.config import ConfigError

    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"job.output_root: cannot create the run directory {path} ({e.strerror}: "
            f"{e.filename}); point job.output_root at a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"job.output_root: the run directory {path} is not writable; point job.output_root "
            "at a writable directory"
        )
    return path
