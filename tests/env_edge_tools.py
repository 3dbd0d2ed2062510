"""Tools for tests/test_env_edges.py: module-level, typed and documented (the worker forks)."""

from __future__ import annotations

import subprocess
import time


def surrogate(text: str) -> str:
    """Answer text holding a lone surrogate (bytes decoded with surrogateescape).

    Args:
        text: Ignored.
    """
    return b"ok \xff done".decode("utf-8", "surrogateescape")


def spawn(seconds: str) -> str:
    """Start a child that sleeps, and answer its pid.

    Args:
        seconds: How long the child sleeps.
    """
    return str(subprocess.Popen(["sleep", seconds]).pid)


def spawn_and_hang(seconds: str) -> str:
    """Start a child that sleeps, note its pid in child.pid, then hang past any time limit.

    Args:
        seconds: How long the child sleeps.
    """
    pid = subprocess.Popen(["sleep", seconds]).pid
    with open("child.pid", "w") as f:
        f.write(str(pid))
    time.sleep(float(seconds))
    return "never"
