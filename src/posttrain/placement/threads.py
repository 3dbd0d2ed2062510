"""Threads that cannot collapse: warn when a run's torch threads would outnumber free cores.

OpenMP threads spin while they wait for each other; with more busy threads than cores they
wait for a core instead, and a step can take 10x longer or never finish (a SmolLM2 step with
2 threads on a loaded 2-core machine did not finish in 900 s). The decision is a pure function
of the load (:func:`oversubscription`), so it is tested with injected values; :func:`node_load`
reads this machine's: the cores this process may run on, the 1-minute load average, other
posttrain processes (:func:`runs_posttrain`) and Ray worker processes. torch is not imported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodeLoad:
    cores: int
    load_average: float
    posttrain_processes: int  # other than this one
    ray_workers: int


def _cmdlines(proc: Path = Path("/proc")) -> list[tuple[int, list[str]]]:
    out = []
    for entry in proc.glob("[0-9]*"):
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if argv:
            out.append((int(entry.name), argv))
    return out


#: Interpreter options that take the next argument as their value.
_VALUED = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def runs_posttrain(argv: list[str]) -> bool:
    """Whether a command line is a posttrain process: the ``posttrain`` script, a Python
    interpreter running it, ``-m posttrain...`` or our vLLM worker module, code (``-c``) that
    names posttrain, or a vLLM engine core (``VLLM::...``, what our worker's child is titled).
    Judged on the program and its entry, never on a substring anywhere in the line: a shell
    whose command text mentions posttrain, an editor on a posttrain file or
    ``flock /tmp/posttrain.lock`` run no torch threads. A script of ours run by path (a
    benchmark) is not recognised."""
    prog = Path(argv[0]).name
    if prog == "posttrain" or argv[0].startswith("VLLM::"):
        return True
    if not prog.startswith("python"):
        return False
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        flag = rest[0]
        if flag in ("-m", "-c") or flag.startswith(("-m", "-c")) and not flag.startswith("--"):
            value = flag[2:] or (rest[1] if len(rest) > 1 else "")
            if flag.startswith("-c"):
                return "posttrain" in value
            return value.split(".")[0] in ("posttrain", "posttrain_vllm_worker")
        rest = rest[2:] if flag in _VALUED else rest[1:]
    return bool(rest) and Path(rest[0]).name == "posttrain"


def node_load() -> NodeLoad:
    """This machine's load as :func:`oversubscription` reads it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    me, parent = os.getpid(), os.getppid()
    others = [argv for pid, argv in _cmdlines() if pid not in (me, parent)]
    ray = sum(argv[0].startswith("ray::") for argv in others)
    mine = sum(runs_posttrain(argv) for argv in others)
    return NodeLoad(cores, os.getloadavg()[0], mine, ray)


def oversubscription(threads: int, load: NodeLoad, processes: int = 1) -> str | None:
    """One line saying why ``processes`` x ``threads`` torch threads (this process, or the Ray
    actors a local Ray instance is about to start) would contend and what to set, or None.

    Busy elsewhere: the load average less this process (at most 1 of it is ours while it
    starts), or the other posttrain and Ray worker processes counted, whichever is larger. One
    thread per process never warns: it cannot spin against a sibling."""
    if threads <= 1:
        return None
    busy = max(load.load_average - 1.0, float(load.posttrain_processes + load.ray_workers))
    free = load.cores - busy
    if threads * processes <= free:
        return None
    fit = max(1, int(free // processes))
    actors = f" x {processes} Ray actors" if processes > 1 else ""
    return (
        f"placement.torch_threads_per_process={threads}{actors} on {load.cores} core(s) with load "
        f"average {load.load_average:.1f} ({load.posttrain_processes} other posttrain "
        f"process(es), {load.ray_workers} Ray worker(s)): threads beyond the free cores spin "
        f"against each other and can slow a step 10x; set "
        f"placement.torch_threads_per_process={fit}"
    )


def set_torch_threads(threads: int, load: NodeLoad | None = None) -> str | None:
    """Set this process's torch threads (``placement.torch_threads_per_process``) and warn in
    one line when they would contend for cores; the warning, or None."""
    import logging

    import torch

    torch.set_num_threads(threads)
    warning = oversubscription(threads, node_load() if load is None else load)
    if warning is not None:
        logging.getLogger("posttrain").warning("%s", warning)
    return warning
