"""The C allocator, told to give back what a burst of work took (glibc only; elsewhere nothing is done).

Issue 14 found the operator's RSS high for good after a burst of Episodes while its live
objects had returned to their baseline: the memory was free inside the process, not given
back. Two things held it:

- Every TLS connection to the API server has a 256 KiB read buffer (asyncio's SSLProtocol),
  and a burst opens a few hundred connections (the client's pool, kopf's, one per exec).
  glibc serves blocks that large from their own mapping at first, but raises its mmap
  threshold to the size of the first one freed, and from then on serves them from the
  heap, where the ones freed later stay as holes. Pinning ``M_MMAP_THRESHOLD`` (which also
  turns that adjustment off) keeps each large block in a mapping of its own, unmapped
  when it is freed.
- Blocks freed in the middle of the heap are returned only by ``malloc_trim``
  (``M_TRIM_THRESHOLD`` applies to the heap's top alone): :func:`release_free_memory_every`
  calls it now and then, from a thread of its own (it takes the allocator's locks, not the GIL's
  time: a few milliseconds for a heap of a few hundred MiB).

The same settings are glibc tunables (``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072``);
setting them here makes every way of starting the operator get them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from functools import cache

M_MMAP_THRESHOLD = -3  # mallopt(3) parameter numbers, from glibc's malloc.h
MMAP_THRESHOLD = 128 * 1024  # glibc's initial default, kept fixed


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    library = ctypes.CDLL(name)
    return library if hasattr(library, "mallopt") and hasattr(library, "malloc_trim") else None


def tune_allocator() -> bool:
    """Keep large blocks (TLS buffers) in mappings of their own; False where glibc's malloc is not in use."""
    glibc = _glibc()
    return glibc is not None and bool(glibc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> bool:
    """Give the free pages inside the heap back to the system (``malloc_trim(0)``); True if any were."""
    glibc = _glibc()
    return glibc is not None and bool(glibc.malloc_trim(0))


def release_free_memory_every(interval_sec: float) -> threading.Event | None:
    """Call :func:`release_free_memory` every ``interval_sec`` in a daemon thread until the returned
    event is set; None where glibc's malloc is not in use."""
    if _glibc() is None:
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_sec):
            release_free_memory()

    threading.Thread(target=loop, name="release-free-memory", daemon=True).start()
    return stop
