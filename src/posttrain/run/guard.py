"""The user-error boundary of every command: one line on stderr, a distinct exit status.

Errors a user causes and can fix (config, data, model folder, disk, a held run directory, a
reward function that fails) print ``posttrain: error: ...`` as one line naming the key, file,
row or step and what to do, and exit non-zero without a traceback. ``--debug`` (or
``POSTTRAIN_DEBUG=1``) prints the traceback too. A signal prints where the last complete
checkpoint is and exits 128 + its number. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from posttrain.config import ConfigError
from posttrain.run.signals import RunInterrupted, signals_raise
from posttrain.textsafe import sanitize

#: Exit status for a user error in the config or the overrides.
EXIT_CONFIG_ERROR = 2
#: Exit status for another user error (a reward function that raises, a bad data row, ...).
EXIT_RUN_ERROR = 1
#: The environment variable that, set to 1, shows tracebacks of user errors (like ``--debug``).
DEBUG_ENV = "POSTTRAIN_DEBUG"
#: A message is cut to this many characters (a 5 MB bad value is not echoed whole), except the
#: list of choices an error ends with (its ``choices`` attribute), which is always kept whole.
MAX_MESSAGE = 600

_OS_ADVICE = {
    errno.ENOSPC: "free space on that disk and rerun (a run resumes from its last checkpoint)",
    errno.EDQUOT: "free space within your quota and rerun (a run resumes from its last checkpoint)",
    errno.EACCES: "make it writable or point job.output_root (or the path's key) elsewhere",
    errno.EPERM: "make it writable or point job.output_root (or the path's key) elsewhere",
    errno.EROFS: "the filesystem is read-only; point job.output_root elsewhere",
    errno.ENOTDIR: "a part of that path is a file, not a directory; fix the path",
    errno.EEXIST: "a file is in the way of a directory; fix the path",
    errno.ENOENT: "check the path",
}


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input a user controls: reported in one line, never with a traceback."""
    from posttrain.data.tasks import TaskDataError
    from posttrain.env.base import EnvironmentFailedError
    from posttrain.metrics.plot import PlotError
    from posttrain.metrics.sinks import MetricsFileError
    from posttrain.model.errors import ModelLoadError
    from posttrain.placement.errors import RoleFailedError
    from posttrain.reward import RewardError
    from posttrain.run.lock import RunLockedError
    from posttrain.trainer import TrainerError

    return (
        RewardError, TaskDataError, TrainerError, RoleFailedError, ModelLoadError,
        MetricsFileError, PlotError, RunLockedError, EnvironmentFailedError, OSError,
    )  # fmt: skip


def one_line(message: str, limit: int = MAX_MESSAGE, keep: str = "") -> str:
    """``message`` on one line; past ``limit`` characters its middle is cut (the start names
    what failed, the end says what to do), and the cut length is said. A closing ``keep`` (the
    list of choices an error offers) is never cut: the limit applies to the text before it."""
    flat, kept = " ".join(sanitize(message).split()), " ".join(sanitize(keep).split())
    if kept and flat.endswith(kept):
        head = flat[: len(flat) - len(kept)]
        return one_line(head, limit) + (" " if head.endswith(" ") else "") + kept
    if len(flat) <= limit:
        return flat
    head, tail = limit * 2 // 3, limit // 3
    return f"{flat[:head]} ... [{len(flat) - head - tail} characters cut] ... {flat[-tail:]}"


def describe(error: BaseException) -> str:
    """The one-line text of a user error."""
    if isinstance(error, ConfigError):
        return str(error)
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        advice = _OS_ADVICE.get(error.errno)
        return f"{error.strerror}{where}" + (f"; {advice}" if advice else "")
    return f"{type(error).__name__}: {error}"


def debug_requested(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_guarded(fn: Callable[[], int], debug: bool = False) -> int:
    """Run ``fn``; a config error exits 2, another user error exits 1, a signal 128 + its
    number, each reported as one line. ``debug`` also prints the traceback."""
    debug = debug_requested(debug)
    try:
        with signals_raise(), warnings.catch_warnings():
            if not debug:
                warnings.formatwarning = _warning_line
            return fn()
    except RunInterrupted as e:
        return _report(e, f"posttrain: {e}", e.exit_code, debug)
    except KeyboardInterrupt as e:
        return _report(e, "posttrain: stopped by SIGINT", 130, debug)
    except SystemExit as e:
        # Nothing inside a command exits the process: user code (a reward function, an objective)
        # did. Ending the run with its status, maybe 0, would pass for success.
        return _report(
            e,
            f"posttrain: error: user code called sys.exit({e.code!r}) during the run (a reward "
            "function, objective or other imported code); the run stopped there, its last "
            "checkpoint is kept; remove that call (raise an exception to fail a run)",
            EXIT_RUN_ERROR,
            debug,
        )
    except ConfigError as e:
        return _report(e, f"posttrain: error: {describe(e)}", EXIT_CONFIG_ERROR, debug)
    except user_errors() as e:
        return _report(e, f"posttrain: error: {describe(e)}", EXIT_RUN_ERROR, debug)


#: Where this package's own files are: a warning raised there is posttrain's.
_PACKAGE = Path(__file__).resolve().parents[1]
#: Warnings that are never posttrain's own, wherever ``stacklevel`` points them.
_LIBRARY_NOTICES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """Warnings as one line each (the source location is for ``--debug``), named by who raised
    them: ``posttrain: warning:`` only for this package's own; a library's (``transformers``'
    deprecation notices) under the library's name, so nobody takes them for a config problem."""
    text = one_line(str(message))
    origin = _origin(filename)
    if origin == "posttrain" and not issubclass(category, _LIBRARY_NOTICES):
        return f"posttrain: warning: {text}\n"
    if origin == "posttrain":  # a library's notice pointed at its caller here (stacklevel)
        origin = f"a library called from {Path(filename).name}:{lineno}"
    return f"{origin}: {category.__name__}: {text}\n"


def _origin(filename: str) -> str:
    """``posttrain``, the installed package a file belongs to, or the file's name."""
    path = Path(filename).resolve()
    if path.is_relative_to(_PACKAGE):
        return "posttrain"
    parts = path.parts
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1].removesuffix(".py")
    return path.name


def _report(error: BaseException, message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(error, file=sys.stderr)
    keep = getattr(error, "choices", "")
    print(
        one_line(message, keep=keep if isinstance(keep, str) else ""), file=sys.stderr, flush=True
    )
    return code
