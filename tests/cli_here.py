"""``posttrain ARGS`` run in this process, as a shell in folder ``cwd`` would run it.

For tests of what a command answers (its exit status, its one-line errors, what it writes), where
a fresh interpreter adds only seconds of importing torch. The command finds the folder's modules
as from the shell (the CLI's own ``import_from_cwd`` puts it on the path); a module of the same
name that another test's folder left in ``sys.modules`` is forgotten first, and the folder's own
after. ``POSTTRAIN_DEBUG`` is unset for the call, as in the clean environment of a user's shell.

What stderr holds here is what the command prints (its one-line errors): log records and
``warnings.warn`` go to pytest's capture, not to stderr. Tests of what a real process prints or
loads start one: ``tests/test_cli.py``, ``tests/test_config_show_torch_free.py``, the one-line
refusals from real processes in ``tests/test_entry_grpo.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from posttrain.entrypoints.cli import main
from posttrain.run.guard import DEBUG_ENV


def _forget(folder: Path) -> None:
    """Forget the modules named like the folder's files, and those loaded from it."""
    names = {p.stem for p in folder.glob("*.py")} | {
        p.parent.name for p in folder.glob("*/__init__.py")
    }
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        if name.split(".")[0] in names or where.startswith(f"{folder}{os.sep}"):
            del sys.modules[name]


def posttrain_here(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``posttrain *argv`` in ``cwd``; its status and output as ``subprocess.run`` gives
    them."""
    out, err = io.StringIO(), io.StringIO()
    old, folder = Path.cwd(), Path(cwd).resolve()
    debug = os.environ.pop(DEBUG_ENV, None)
    _forget(folder)
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(old)
        _forget(folder)
        if debug is not None:
            os.environ[DEBUG_ENV] = debug
    return subprocess.CompletedProcess(["posttrain", *argv], code, out.getvalue(), err.getvalue())
