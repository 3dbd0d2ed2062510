"""A deadline on each role call of an in-process run: a hung reward function (or any role call)
fails the run in one line naming the role, as a hung actor does under Ray.

In-process there is no other process to wait on, so a watchdog thread interrupts the driver's
main thread: when a call outlives ``placement.role_call_timeout_s`` it sends ``SIGUSR2`` to that
thread (``pthread_kill``, so a blocking system call such as ``sleep`` returns EINTR and Python
runs the handler), and the handler raises :class:`RoleCallTimeout` (a ``RoleFailedError``). The handler stays installed
while the roles live and acts only on the expired call's token, so a signal that lands just after
the call returned does nothing. Off the main thread, or where ``pthread_kill`` is missing
(Windows), calls run without a deadline.
"""

from __future__ import annotations

import functools
import inspect
import signal
import threading
from collections.abc import Callable
from typing import Any

from posttrain.placement.errors import RoleCallTimeout

_SIGNAL = getattr(signal, "SIGUSR2", None)


class Deadlines:
    """Runs role calls under one deadline each; :meth:`wrap` gives a role whose methods do."""

    def __init__(self, seconds: float, checkpoints: str) -> None:
        self.seconds, self.checkpoints = seconds, checkpoints
        self._lock = threading.Lock()
        self._expired: tuple[int, str] | None = None  # (token, role) of the call that ran over
        self._token = 0
        self._previous: Any = None
        self.active = (
            _SIGNAL is not None
            and hasattr(signal, "pthread_kill")
            and threading.current_thread() is threading.main_thread()
        )
        if self.active:
            self._main = threading.main_thread().ident
            self._previous = signal.signal(_SIGNAL, self._on_signal)

    def wrap(self, role: Any, name: str) -> Any:
        return _Deadlined(role, name, self) if self.active else role

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        with self._lock:
            self._token += 1
            token = self._token
        timer = threading.Timer(self.seconds, self._expire, (token, name))
        timer.daemon = True
        timer.start()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.cancel()
            with self._lock:
                self._token += 1  # this call is over: a late signal for it is ignored

    def close(self) -> None:
        if self.active:
            signal.signal(_SIGNAL, self._previous)
            self.active = False

    def _expire(self, token: int, name: str) -> None:
        with self._lock:
            if token != self._token:
                return  # the call returned meanwhile
            self._expired = (token, name)
        signal.pthread_kill(self._main, _SIGNAL)

    def _on_signal(self, signum, frame) -> None:
        with self._lock:
            expired, self._expired = self._expired, None
            current = self._token
        if expired is None or expired[0] != current:
            return
        raise RoleCallTimeout(
            f"the {expired[1]} role did not return within placement.role_call_timeout_s="
            f"{self.seconds:g} s (a hung reward function or role call?); the run stopped. "
            f"Complete checkpoints under {self.checkpoints} are intact: rerun with "
            "rl.resume=auto to continue from the last one (raise placement.role_call_timeout_s "
            "if its calls really take that long)"
        )


class _Deadlined:
    """A role whose method calls run under the deadline; attributes pass through."""

    def __init__(self, role: Any, name: str, deadlines: Deadlines) -> None:
        self._role, self._name, self._deadlines = role, name, deadlines

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._role, attr)
        if not inspect.ismethod(value) or attr.startswith("_"):
            return value  # data (the policy's module included) passes through as it is
        return functools.partial(self._deadlines.call, self._name, value)


def unwrap(role: Any) -> Any:
    """The role object itself, with or without a deadline around its calls."""
    return role._role if isinstance(role, _Deadlined) else role
