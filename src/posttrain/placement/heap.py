"""Give freed tensor memory back to the system (glibc), so peak RSS follows live tensors.

glibc serves a large allocation with its own mmap and unmaps it on free, but after each such
free it raises that threshold (up to 32 MiB), so the activations and logits of later steps come
from the heap, whose freed middle it keeps. A GRPO step's forward, backward and rollout then
leave hundreds of MB resident that no tensor uses (measured for the SmolLM2 recipe in
docs/guides/performance.md). Fixing the threshold keeps every allocation above it on mmap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)
#: mallopt's M_MMAP_THRESHOLD, and the threshold the profile measured (64 KiB).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 16
_done = False


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold for this process (once); False where libc is not glibc."""
    global _done
    if _done:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    except OSError:
        mallopt = None
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not _done:
        _log.warning("mallopt(M_MMAP_THRESHOLD) failed; freed memory may stay resident")
    return _done
