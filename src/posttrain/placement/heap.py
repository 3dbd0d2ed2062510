"""Hand freed memory back to the system between phases (glibc), so RSS follows live tensors.

glibc keeps freed heap memory resident (it only trims the top of the heap, and after each large
free it raises its mmap threshold, so later activations and logits come from the heap). Without
a trim, what a rollout freed stays resident while the update allocates, and the update's while
the checkpoint is written. ``malloc_trim`` at those boundaries returns it at no measurable cost
(docs/guides/performance.md, "Memory"). Within a phase the heap still fragments; glibc's own
``MALLOC_MMAP_THRESHOLD_=65536`` environment variable removes most of that, at a cost in time.

A trim is skipped while the heap holds less than :data:`TRIM_MIN_FREE_BYTES` free: every page
it returns faults back in when the next phase allocates (a zeroed page each), which a large
model's phases never notice and a tiny model's steps pay in full. ``make demo-tools`` trimmed
~80 MB twice a step and spent a quarter of its CPU time in the kernel refilling it.

glibc returns memory on its own too, by two thresholds it moves as a process runs: a freed
block above the mmap threshold is unmapped, and the heap's top is cut back past the trim
threshold. A training step allocates the same few-MB tensors every step, so each step faulted
them in afresh (``make demo-tools``: ~20,000 page faults a step after the trim's floor).
:func:`pin_thresholds` fixes both: blocks up to 32 MiB (glibc's largest mmap threshold) come
from the heap and are reused, and the top is cut back only past :data:`TRIM_MIN_FREE_BYTES`,
the same floor as :func:`trim`. A threshold the environment sets (``MALLOC_*_``,
``GLIBC_TUNABLES``) is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os


def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "gnu_get_libc_version") else None


_LIBC = _glibc()
#: Free heap memory below which :func:`trim` leaves the heap alone (see the module's docstring).
TRIM_MIN_FREE_BYTES = 256 * 2**20
#: glibc's largest mmap threshold (``HEAP_MAX_SIZE / 2`` on 64-bit); larger blocks are mapped.
MMAP_THRESHOLD_BYTES = 32 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


_MALLINFO2 = getattr(_LIBC, "mallinfo2", None)  # glibc 2.33+
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def free_heap_bytes() -> int | None:
    """Bytes in glibc's free chunks over all arenas (``mallinfo2``); None where that cannot be
    read."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.fordblks + info.fsmblks)


def trim(min_free: int = TRIM_MIN_FREE_BYTES) -> bool:
    """Return the heap's free pages to the system (``malloc_trim``) when it holds at least
    ``min_free`` bytes free (always where that cannot be read); False where libc is not glibc,
    the heap held less, or nothing could be returned."""
    if _LIBC is None:
        return False
    free = free_heap_bytes()
    if free is not None and free < min_free:
        return False
    return bool(_LIBC.malloc_trim(0))


def pin_thresholds() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` and its trim threshold at
    :data:`TRIM_MIN_FREE_BYTES` for this process (``mallopt``), so a step's freed tensors are
    reused by the next step rather than returned and faulted back in (see the module's
    docstring). False where libc is not glibc, or where the environment sets a malloc threshold
    (``MALLOC_*_THRESHOLD_``) or any ``glibc.malloc`` tunable (``GLIBC_TUNABLES``)."""
    if _LIBC is None or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if any(k.startswith("MALLOC_") and k.endswith("_THRESHOLD_") for k in os.environ):
        return False
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        _LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_MIN_FREE_BYTES)
    )
