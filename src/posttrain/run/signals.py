"""SIGINT and SIGTERM during a run: stop at a step boundary, say where to resume from.

Schedulers (Slurm, Kubernetes, Ray) send SIGTERM and wait a grace period before SIGKILL; a user
presses Ctrl-C. Either way a run should stop with a checkpoint on disk and one line saying how to
continue. The online loop wraps its steps in :class:`GracefulStop`::

    with GracefulStop(config.checkpoint.save_on_signal, resumed_from) as stop:
        for step in ...:
            ...                                    # one step; maybe a periodic save
            stop.after_step(step, saved_path, functools.partial(roles.policy.save, step, state))

With ``save_on_signal`` the first signal lets the current step finish, saves it (unless that step
was just saved) and stops; a second signal abandons the step at once. The first signal waits at
most ``grace_s`` (``checkpoint.signal_grace_s``): a step held up by a hung role or a stalled
disk is then abandoned as on a second signal (a SIGALRM timer interrupts the wait), so a
scheduler's SIGTERM always ends the run with the last complete checkpoint named. Without it the first signal
abandons the step at once (nothing would be kept of it anyway). Either way :class:`RunInterrupted`
propagates, carrying the last complete checkpoint; the user-error boundary prints it and exits
128 + the signal number (130 for SIGINT, 143 for SIGTERM). An abandoned checkpoint save removes
its temp directory on the way out.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """The run stopped because of a signal; ``exit_code`` is the shell's 128 + signal number."""

    def __init__(
        self,
        signum: int,
        step: int | None = None,
        checkpoint: str | None = None,
        reason: str | None = None,
    ):
        self.signum, self.step, self.checkpoint, self.reason = signum, step, checkpoint, reason
        super().__init__(self.describe())

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def describe(self) -> str:
        name = signal.Signals(self.signum).name
        if self.reason:
            name = f"{name} ({self.reason})"
        if self.step is None and self.checkpoint is None:
            return f"stopped by {name}"
        where = "" if self.step is None else f" after step {self.step}"
        if self.checkpoint:
            resume = (
                f"last complete checkpoint: {self.checkpoint}; rerun the same command to resume "
                "from it (rl.resume=auto)"
            )
        else:
            resume = "no checkpoint was written yet; rerunning the same command starts over"
        return f"stopped by {name}{where}; {resume}"


#: Set while the main thread is inside a foreign wait that must not see exceptions from signal
#: handlers (see :func:`deferred`); what a handler would raise meanwhile is kept here.
_deferring = False
_deferred: list[RunInterrupted] = []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold off :class:`RunInterrupted` from this module's handlers while inside the block, and
    raise it when the block ends. For short blocking calls into native code that run Python's
    signal handlers but mishandle an exception they raise (Ray's ``wait`` turns it into a
    ``SystemError`` or drops it): callers keep such calls short, so a stop waits at most that."""
    global _deferring
    if _deferring:  # nested: the outer block raises
        yield
        return
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _deferred:
        error = _deferred[-1]
        _deferred.clear()
        raise error


def _stop(error: RunInterrupted) -> None:
    """Raise ``error`` from a signal handler, or keep it for the end of a :func:`deferred` block."""
    if _deferring:
        _deferred.append(error)
        return
    raise error


def _raise(signum: int, frame: object) -> None:
    _stop(RunInterrupted(signum))


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`RunInterrupted` (the whole CLI command, outside a loop):
    a SIGTERM then unwinds ``finally`` blocks and is reported instead of killing silently."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class GracefulStop:
    """Signal handling of one loop; see the module docstring. ``checkpoint`` is the one the run
    resumed from (None for a fresh run). Use as a context manager, or ``install()`` before the
    loop and ``uninstall()`` in its ``finally``."""

    def __init__(
        self,
        save_on_signal: bool,
        checkpoint: str | Path | None = None,
        grace_s: float | None = None,
    ) -> None:
        if grace_s is not None and not (math.isfinite(grace_s) and grace_s > 0):
            raise ValueError(f"grace_s must be finite and > 0, got {grace_s}")
        self.save_on_signal = save_on_signal
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.grace_s = grace_s
        self.step: int | None = None
        self.pending: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self.handle) for s in SIGNALS}
            self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._grace_over)
        return self

    def uninstall(self) -> None:
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def handle(self, signum: int, frame: object) -> None:
        if self.pending is not None or not self.save_on_signal:
            _stop(RunInterrupted(signum, self.step, self.checkpoint))
            return
        self.pending = signum
        name = signal.Signals(signum).name
        within = ""
        if self.grace_s is not None and self._previous:
            signal.setitimer(signal.ITIMER_REAL, self.grace_s)
            within = f" within {self.grace_s:g} s (checkpoint.signal_grace_s)"
        print(
            f"posttrain: {name} received: finishing this step and saving a checkpoint{within} "
            f"(send {name} again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def _grace_over(self, signum: int, frame: object) -> None:
        if self.pending is None:  # not armed by us (a stray SIGALRM): nothing to stop
            return
        reason = (
            f"the step did not finish within checkpoint.signal_grace_s={self.grace_s:g} s; "
            "it was abandoned"
        )
        _stop(RunInterrupted(self.pending, self.step, self.checkpoint, reason))

    def after_step(self, step: int, saved: str | None, save: Callable[[], str]) -> None:
        """Record a finished step (and its checkpoint, if one was saved); stop if signalled."""
        self.step = step
        if saved is not None:
            self.checkpoint = str(saved)
        if self.pending is not None:
            if saved is None:
                self.checkpoint = str(save())
            if self._previous:
                signal.setitimer(signal.ITIMER_REAL, 0)  # done in time: no grace to run out
            raise RunInterrupted(self.pending, step, self.checkpoint)
