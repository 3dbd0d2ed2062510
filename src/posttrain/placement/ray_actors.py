"""The actors of one Ray-placed run and every wait on them: calls that return at the first
failure, a failure reported as one line naming the role, signals heard while waiting.

Split from ``placement/ray.py`` (which places the roles): waiting and failing are their own
concern, and the DPO placement uses the same group.
"""

from __future__ import annotations

import logging
import os
import re
import sysconfig
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from posttrain.config import ConfigError
from posttrain.placement.errors import RoleFailedError
from posttrain.run.signals import deferred
from posttrain.textsafe import exception_text, sanitize

log = logging.getLogger("posttrain")

#: After one actor fails, how long to look for a death among the others (the root cause: a rank
#: that loses its peer fails too, and the report should name the peer that died).
DEATH_GRACE_S = 5.0
#: Where the standard library lives: its frames are not where a failure is to be fixed.
_STDLIB = sysconfig.get_paths()["stdlib"]
#: Longest single wait inside :meth:`ActorGroup.gather` before Python's signal handlers get a turn.
POLL_S = 0.5


@dataclass
class ActorGroup:
    """Named actor handles and how to end them; shared by the role facades.
    ``call_timeout_s``: how long one role call may take (``placement.role_call_timeout_s``)."""

    handles: dict[str, Any] = field(default_factory=dict)
    checkpoints: str = ""
    call_timeout_s: float | None = None

    def gather(self, calls: Sequence[tuple[str, Any]], timeout: float | None = None) -> list:
        """Results of ``(role name, ObjectRef)`` calls, raising at the first failure.

        ``timeout``: seconds for actors to start (start-up calls); other calls get
        ``call_timeout_s``. The wait returns to Python every :data:`POLL_S` seconds, so signal
        handlers run while an actor is hung or stopped (Ray's own wait would hold them off).
        """
        names = {ref: name for name, ref in calls}
        pending = [ref for _, ref in calls]
        limit = self.call_timeout_s if timeout is None else timeout
        deadline = None if limit is None else time.monotonic() + limit
        while pending:
            left = POLL_S if deadline is None else min(deadline - time.monotonic(), POLL_S)
            if left <= 0:
                late = ", ".join(names[r] for r in pending)
                if timeout is not None:
                    raise RoleFailedError(
                        f"{late} did not start within {timeout:.0f} s; the Ray cluster may lack "
                        "free resources for them (see placement.cpus_per_role / "
                        "placement.gpus_per_role)"
                    )
                raise RoleFailedError(
                    f"the {late} role did not answer within placement.role_call_timeout_s="
                    f"{limit:g} s (its process may be hung or stopped); the run stopped. Complete "
                    f"checkpoints under {self.checkpoints} are intact: rerun with rl.resume=auto "
                    "to continue from the last one (raise placement.role_call_timeout_s if its "
                    "calls really take that long)"
                )
            ready, pending = _wait(pending, left)
            if not ready:
                continue
            try:
                ray.get(ready[0])
            except RayError as e:
                raise self._failure(names, names[ready[0]], e, pending) from e
        return ray.get([ref for _, ref in calls])

    def _failure(self, names, name: str, error: RayError, pending) -> BaseException:
        if not isinstance(error, RayActorError) and pending:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
            for ref in done:
                try:
                    ray.get(ref)
                except RayActorError as death:
                    name, error = names[ref], death
                    break
                except RayError:
                    pass
        if isinstance(error, RayActorError):
            return RoleFailedError(
                f"the {name} actor died ({_first_lines(error)}); the run stopped. Complete "
                f"checkpoints under {self.checkpoints} are intact: rerun with rl.resume=auto to "
                "continue from the last one"
            )
        cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
        if isinstance(cause, ConfigError) or type(cause).__module__.startswith("posttrain."):
            return cause
        log.error("%s failed; remote traceback:\n%s", name, error)
        what = exception_text(cause) if cause is not None else _first_lines(error)
        frame = _last_code_frame(getattr(error, "traceback_str", "") or "")
        return RoleFailedError(f"the {name} role failed: {what}{frame}")

    def close(self) -> None:
        for handle in self.handles.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception as e:  # already gone: nothing to end
                log.debug("ray.kill: %s", e)
        self.handles.clear()


def _wait(refs: list, timeout: float) -> tuple[list, list]:
    """``ray.wait`` for one of ``refs``. Ray's C++ wait runs Python's signal handlers but
    mishandles an exception they raise (drops it, or reports a ``SystemError`` "returned a
    result with an exception set"): posttrain's stop is deferred to the end of the (short) wait,
    and any other handler's exception is re-raised as itself. Off the main thread (a lagged
    run's data side, ``run/pipeline.py``) no signal handler runs, so nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        return ray.wait(refs, num_returns=1, timeout=timeout)
    try:
        with deferred():
            return ray.wait(refs, num_returns=1, timeout=timeout)
    except SystemError as e:
        inner = e.__cause__ or e.__context__
        if inner is not None and not isinstance(inner, SystemError):
            raise inner from None
        raise


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)


def _last_code_frame(traceback_text: str) -> str:
    """`` (at file.py:12 in build)``: the innermost frame of a remote traceback outside Ray and
    the standard library, i.e. the project's or the user's code; empty when there is none."""
    frames = [
        m for m in _FRAME.finditer(traceback_text)
        if f"{os.sep}ray{os.sep}" not in m["file"] and not m["file"].startswith(_STDLIB)
    ]  # fmt: skip
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last['file']}:{last['line']} in {last['func']})"


def _first_lines(error: BaseException) -> str:
    """An error's message without Ray's indented detail lines (ids, pids, addresses)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and ln[:1] != "\t"]
    text = sanitize(" ".join(lines)) or type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class RemoteRole:
    """A role in one actor: ``facade.method(...)`` runs ``role.method(...)`` there and waits."""

    def __init__(self, actors: ActorGroup, name: str) -> None:
        self._actors, self._name = actors, name

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            host = self._actors.handles[self._name]
            return self._actors.gather([(self._name, host.call.remote(method, *args, **kwargs))])[0]

        return call
