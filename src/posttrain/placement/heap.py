"""Hand freed memory back to the system between phases (glibc), so RSS follows live tensors.

glibc keeps freed heap memory resident (it only trims the top of the heap, and after each large
free it raises its mmap threshold, so later activations and logits come from the heap). Without
a trim, what a rollout freed stays resident while the update allocates, and the update's while
the checkpoint is written. ``malloc_trim`` at those boundaries returns it at no measurable cost
(docs/guides/performance.md, "Memory"). Within a phase the heap still fragments; glibc's own
``MALLOC_MMAP_THRESHOLD_=65536`` environment variable removes most of that, at a cost in time.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "gnu_get_libc_version") else None


_LIBC = _glibc()


def trim() -> bool:
    """Return the heap's free pages to the system (``malloc_trim``); False where libc is not
    glibc or nothing could be returned."""
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False
