"""placement/heap.py: a trim hands the memory freed tensors leave in glibc's heap back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
#: Frees 100 of 101 blocks of 2 MiB after one 2 MiB free has raised glibc's adaptive threshold
#: (so they come from the heap); prints the MB of RSS the frees gave back, then the trim.
SCRIPT = """
import os
import torch
from posttrain.placement.heap import trim
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
x = torch.ones(1 << 19)
del x
keep = [torch.ones(1 << 19) for _ in range(101)]
before = rss()
last = keep[-1]
del keep
freed = rss()
assert trim(min_free=100 << 20)
print((before - freed) / 1e6, (freed - rss()) / 1e6)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_heap_blocks_stay_resident_until_trimmed():
    out = subprocess.run([sys.executable, "-c", SCRIPT], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    by_free, by_trim = map(float, out.stdout.split())
    assert by_free < 50  # glibc keeps the 100 freed blocks (210 MB) in its heap
    assert by_trim > 150  # the trim returns them


SMALL = """
import torch
from posttrain.placement.heap import TRIM_MIN_FREE_BYTES, free_heap_bytes, trim
x = torch.ones(1 << 19)
del x
keep = [torch.ones(1 << 19) for _ in range(11)]
last = keep[-1]  # holds the heap's top: the 10 blocks below stay in the heap, free
del keep  # ~21 MB free in the heap: below the default floor
free = free_heap_bytes()
assert free is not None and 20e6 < free < TRIM_MIN_FREE_BYTES, free
print(trim(), trim(min_free=0))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_heap_with_little_free_is_left_alone_unless_asked():
    """A tiny model's step frees tens of MB; trimming them made every step fault them back in.
    The free bytes are glibc's own count (``mallinfo2``), and a floor of 0 trims anyway."""
    out = subprocess.run([sys.executable, "-c", SMALL], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    assert out.stdout.split() == ["False", "True"]


#: A training loop's pattern: each "step" allocates ten 4 MiB tensors and frees them all; prints
#: whether the thresholds were pinned and the minor page faults of steps 6-10 (a fresh 4 MiB
#: faults in 1,024 pages).
PINNED = """
import resource, sys, torch
from posttrain.placement.heap import _LIBC, _M_MMAP_THRESHOLD, pin_thresholds
# glibc's starting threshold (128 KiB) held still: where its moving thresholds settle varies
# from run to run (with the address layout), this is their worst case, every run
_LIBC.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
pinned = pin_thresholds() if sys.argv[1] == "pin" else False
def step():
    keep = [torch.ones(1 << 20) for _ in range(10)]
    del keep
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(pinned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
@pytest.mark.parametrize("env", [{}, {"MALLOC_MMAP_THRESHOLD_": "131072"}], ids=["", "user-set"])
def test_pinned_thresholds_reuse_a_steps_freed_blocks_and_a_user_setting_wins(env):
    """Below glibc's mmap threshold every step maps its 4 MiB blocks afresh and faults them all
    in again (glibc's own moving thresholds do that in some runs and not in others); pinned,
    later steps reuse the first steps' blocks. A threshold the environment sets is kept."""
    run = {"PYTHONPATH": str(SRC), **env}
    got = {}
    for mode in ("pin", "default"):
        out = subprocess.run([sys.executable, "-c", PINNED, mode], check=True, text=True,
                             capture_output=True, env=run, timeout=120)  # fmt: skip
        got[mode] = out.stdout.split()
    assert got["pin"][0] == ("False" if env else "True")
    if not env:
        assert int(got["pin"][1]) < 1_000 < 25_000 < int(got["default"][1]), got
