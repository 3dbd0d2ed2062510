"""placement/heap.py: with glibc's mmap threshold fixed, freed tensors leave the process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
#: Frees 100 of 101 blocks of 2 MiB after one 2 MiB free has raised glibc's adaptive threshold;
#: prints how many MB of RSS the frees gave back.
SCRIPT = """
import os, sys
import torch
from posttrain.placement.heap import return_freed_memory
if sys.argv[1] == "fixed":
    assert return_freed_memory() and return_freed_memory()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
x = torch.ones(1 << 19)
del x
keep = [torch.ones(1 << 19) for _ in range(101)]
before = rss()
last = keep[-1]
del keep
print((before - rss()) / 1e6)
"""


def _returned_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(SRC)}, timeout=120)  # fmt: skip
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_blocks_are_returned_only_with_the_threshold_fixed():
    assert _returned_mb("fixed") > 150  # 100 blocks of 2.1 MB
    assert _returned_mb("default") < 50  # glibc keeps them in its heap
