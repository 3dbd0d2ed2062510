"""The rank side of ``tests/gloo_ranks.py``: ``python WORKER.py RANK WORLD STORE JSON`` joins a
gloo process group through the rendezvous file STORE and runs each job of the JSON list with the
worker's ``run_job``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch.distributed as dist


def join() -> tuple[int, int]:
    """Join the group of ``gloo_ranks.run`` (``RANK WORLD STORE`` lead the arguments; STORE is
    the rendezvous file); returns (rank, world)."""
    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    return rank, world


def serve(run_job: Callable[[dict, int, int], None]) -> None:
    rank, world = join()
    spec = sys.argv[4]
    for job in json.loads(spec):
        run_job(job, rank, world)
    dist.destroy_process_group()
