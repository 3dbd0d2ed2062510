"""``posttrain ARGS`` run in this process, as a shell in folder ``cwd`` would run it.

For tests of what a command answers (exit status, its one-line errors, what it writes), where a
fresh interpreter adds only seconds of importing torch: the working directory is the current one
and importable (a user's reward, builder or environment module beside the run), stdout and stderr
are captured apart, and modules from outside this repository and the interpreter (a test
folder's own files) are forgotten before and after, so a folder's file is read anew as a fresh
process would read it, whatever another test's folder of the same module name left. Tests of the process itself (exit codes of a real process, a
kill, what an interpreter loads) start one: ``tests/test_cli.py``,
``tests/test_config_show_torch_free.py``.
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

REPO = Path(__file__).resolve().parents[1]
_OURS = tuple(str(Path(p).resolve()) for p in {REPO, sys.prefix, sys.base_prefix, sys.exec_prefix})


def _forget_user_modules() -> None:
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if where and not str(Path(where).resolve()).startswith(_OURS):
            del sys.modules[name]


def posttrain_here(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``posttrain *argv`` in ``cwd``; its status and output as ``subprocess.run`` gives
    them."""
    out, err = io.StringIO(), io.StringIO()
    old, folder = Path.cwd(), str(Path(cwd).resolve())
    _forget_user_modules()
    os.chdir(folder)
    sys.path.insert(0, folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        sys.path.remove(folder)
        os.chdir(old)
        _forget_user_modules()
    return subprocess.CompletedProcess(["posttrain", *argv], code, out.getvalue(), err.getvalue())
