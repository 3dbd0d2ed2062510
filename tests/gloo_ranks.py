"""Launch a worker script as ``world`` gloo ranks (one process each, one torch thread) and fail
with the log of the first rank that did not exit 0. The worker side is
``scripts/gloo_worker.py``'s :func:`serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def launch(worker: Path, jobs: list[dict], world: int, timeout: float) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(worker)]
    procs = [
        subprocess.Popen([*cmd, str(r), str(world), port, json.dumps(jobs)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]  # fmt: skip
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {r} of {world} failed:\n{log[-6000:]}"
