"""Why a checkpoint save failed, as one line: a full disk, the run directory removed mid-save,
or another write failure. Anything else (a signal, a bug) is not a user error and keeps its
type and traceback.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

from posttrain.trainer.errors import CheckpointError

#: A save that fails with less free space than this on the checkpoint disk failed for want of
#: space (the libraries' own errors often do not say so: ``basic_ios::clear``, ``unexpected
#: pos``); measured before the failed save's temp directory is removed.
_FULL_DISK_BYTES = 4 << 20
#: Errors the serialising libraries (torch's zip writer, safetensors) raise for a failed write.
_LIBRARY_WRITE_ERRORS = ("RuntimeError", "SafetensorError")
#: Text by which such an error says it failed writing (any other RuntimeError is a bug and keeps
#: its type and traceback).
_WRITE_FAILURE_TEXT = (
    "inline_container", "PytorchStreamWriter", "unexpected pos", "basic_ios", "file write",
    "IoError", "I/O error", "os error", "does not exist", "No space left",
)  # fmt: skip


def write_failure(
    error: BaseException, step: int, root: Path, tmp: Path, final: Path
) -> CheckpointError | None:
    """The one-line :class:`CheckpointError` for a save that failed writing files, or None for
    any other failure (a signal, a bug), which propagates as it is."""
    library = type(error).__name__ in _LIBRARY_WRITE_ERRORS and isinstance(error, Exception)
    if not (isinstance(error, OSError) or library):
        return None
    keep = "rerun to resume from the last complete checkpoint, which is untouched"
    missing = library or (isinstance(error, OSError) and error.errno == errno.ENOENT)
    if missing and not tmp.is_dir():
        gone = root if not root.is_dir() else tmp
        return CheckpointError(
            f"checkpoint step {step} could not be saved: {gone} was removed while it was being "
            "written (another process or a cleanup job deleting it?); leave the run directory "
            "alone while a run is writing to it and rerun: it resumes from the newest complete "
            "checkpoint still there"
        )
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    full = full or "No space left on device" in str(error)
    with contextlib.suppress(OSError):  # the disk may not even answer
        full = full or shutil.disk_usage(tmp).free < _FULL_DISK_BYTES
    if full:
        return CheckpointError(
            f"checkpoint step {step} could not be saved to {final}: no space left on that disk; "
            f"free space there (or lower checkpoint.keep_last) and {keep}"
        )
    if isinstance(error, OSError):
        what = f"{error.strerror or error} ({error.filename or tmp})"
    elif not any(marker in str(error) for marker in _WRITE_FAILURE_TEXT):
        return None
    else:
        first = (str(error).strip().splitlines() or [""])[0][:120]
        what = f"{type(error).__name__}: {first}"
    return CheckpointError(
        f"could not write checkpoint step {step} to {final} ({what}); check that disk and {keep}"
    )
