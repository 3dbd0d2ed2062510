"""Launch a worker script as ``world`` gloo ranks (one process each, one torch thread) and fail
with the log of the first rank that did not exit 0, or with every rank's log when they outlive
the timeout. The worker side is ``scripts/gloo_worker.py``'s :func:`serve` (``scripts/dp_worker.py`` joins
the same way).

The ranks meet through a file (``init_method=file://``), not a port: a port probed free here can
be taken by another process (the suite's Ray instance opens many) before rank 0 binds it, and
then rank 1 waits out the whole timeout with nothing in its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def launch(worker: Path, jobs: list[dict], world: int, timeout: float) -> None:
    run(worker, [json.dumps(jobs)], world, timeout)


def run(worker: Path, args: list[str], world: int, timeout: float) -> None:
    """``python WORKER RANK WORLD STORE *args`` for each rank; asserts every rank exits 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="gloo-") as tmp:
        store = str(Path(tmp) / "store")
        procs = [
            subprocess.Popen([sys.executable, str(worker), str(r), str(world), store, *args],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(world)
        ]  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            logs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            logs = [p.communicate()[0] for p in procs]
            tails = "\n".join(f"--- rank {r}:\n{log[-3000:]}" for r, log in enumerate(logs))
            raise AssertionError(
                f"{world} gloo ranks still ran after {timeout} s:\n{tails}"
            ) from None
        finally:
            for p in procs:
                p.kill()
    for r, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {r} of {world} failed:\n{log[-6000:]}"
