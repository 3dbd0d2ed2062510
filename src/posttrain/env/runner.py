"""Tool calls under a time limit: a worker process that is killed when a call runs past it.

A thread cannot be stopped, so a tool stuck in C code (a regex, a big-integer power, a socket)
would hold the caller forever; a process can be killed. A process start per call would add up
over thousands of rollouts, so one worker is forked lazily and serves calls over a pipe.
**Policy at the limit**: the worker and every process a tool started (the worker leads its
own process group) are killed, the call answers a timeout outcome
(the model reads it as the tool's output), and the next call forks a fresh worker. A worker that
dies mid-call (a segfault, ``os._exit``) is answered the same way, as an error.

The worker is forked once from the process that runs environments; what a tool does (open files,
import modules) happens in the worker, so a tool cannot change the caller's state either. The
group is killed at exit too, so a tool's ``sleep`` child does not outlive the run (a child that
starts a session of its own leaves the group and is beyond reach).

Output that is not valid text (a lone surrogate) is answered as the call's error, naming the
character: no tokenizer can read it (:func:`valid_text`). :func:`call_here` answers a call the
same way in the caller's process, for a tool that bounds its own work (``Tool.in_process``).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Characters of a tool's output kept; the rest is cut and says so (a tool may print megabytes).
MAX_OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class Outcome:
    """One call's result: ``text`` is what the model reads; ``ok`` is False for any error."""

    ok: bool
    text: str
    timed_out: bool = False


def as_text(value: Any) -> str:
    """A tool's return value as the text the model reads (JSON for containers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple | int | float | bool) or value is None:
        import json

        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            pass
    return str(value)


def valid_text(ok: bool, text: str) -> tuple[bool, str]:
    """``(ok, text)``, or an error naming the first character that is not text: a lone
    surrogate (bytes decoded with ``surrogateescape``) cannot be encoded, so no tokenizer reads
    it. The model reads that error rather than a guess at the bytes (the call counts as failed).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("unicode_escape").decode("ascii")
        return False, (
            f"the tool's output is not valid text ({bad} at character {e.start}); a tool "
            "returns str of valid Unicode (decode bytes with errors='replace')"
        )
    return ok, text


def _serve(conn: Any, functions: Sequence[Callable[..., Any]]) -> None:
    """Worker loop: ``(index, kwargs)`` in, ``(ok, text)`` out, until the pipe closes.

    The worker leads its own session (so its own process group): whatever a tool starts is in
    that group, and :meth:`ToolRunner.close` kills the whole group, not the worker alone.
    """
    os.setsid()
    while True:
        try:
            index, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_reply(functions[index], kwargs))


def _reply(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, str]:
    """``fn(**kwargs)`` as ``(ok, text)``: the tool's own failure is its output, not ours."""
    try:
        reply = (True, as_text(fn(**kwargs)))
    except Exception as e:
        reply = (False, f"{type(e).__name__}: {e}")
    return valid_text(*reply)


def _outcome(ok: bool, text: str) -> Outcome:
    """The model's view of a finished call: output past :data:`MAX_OUTPUT_CHARS` is cut."""
    if len(text) > MAX_OUTPUT_CHARS:
        cut = len(text) - MAX_OUTPUT_CHARS
        text = f"{text[:MAX_OUTPUT_CHARS]}... [{cut} more characters cut]"
    return Outcome(ok, text)


def call_here(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Outcome:
    """One call in this process, answered as the worker would answer it, without the time limit
    or the isolation: for a tool that bounds its own work and keeps no state (the built-in
    calculator), where the worker's pipe round trip (~90 us idle, more on a busy machine) costs
    more than the call."""
    return _outcome(*_reply(fn, kwargs))


class ToolRunner:
    """Runs ``functions[i](**kwargs)`` in a worker process with a per-call time limit."""

    def __init__(self, functions: Sequence[Callable[..., Any]], timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.functions = tuple(functions)
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        #: Workers started so far (a timeout or a crash starts another); for tests and metrics.
        self.starts = 0
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(method)
        atexit.register(self.close)

    def _start(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_serve, args=(child, self.functions), daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.starts += 1

    def close(self) -> None:
        """Stop the worker and every process a tool started (its process group, killed; a
        tool's call in flight is abandoned). Runs at a time limit, a crash, and at exit."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is None:
            return
        # the group the worker leads (setsid): a tool's children die with it (no such group:
        # the worker was killed before its setsid ran, or it is gone)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.is_alive():
            proc.kill()
        proc.join()

    def call(self, index: int, kwargs: dict[str, Any]) -> Outcome:
        """Run one call; a timeout kills the worker and answers a timed-out error."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self.close()
                self._start()
            try:
                self._conn.send((index, kwargs))
                ready = self._conn.poll(self.timeout_s)
                ok, text = self._conn.recv() if ready else (None, "")
            except (EOFError, OSError, BrokenPipeError):
                self.close()
                return Outcome(False, "the tool's process exited without a result")
            if ok is None:
                self.close()
                return Outcome(False, f"timed out after {self.timeout_s:g} s", timed_out=True)
        return _outcome(bool(ok), text)
