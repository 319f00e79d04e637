"""Give the C heap's free pages back to the system while MindSpore compiles a graph (glibc's `malloc_trim`).

MindSpore's compiler allocates millions of small IR, kernel and actor objects and frees most of them again; glibc
keeps the freed pages in its heap (fragmented: a live object above them pins the heap's top), so the process's
resident set keeps the compile's high-water mark while the first step then fills MindSpore's memory pool on top
of it. Measured on mmrun's GPT (2 layers, hidden 256, seq 512 x 2, compiled, CPU): 440 MB of heap of which 128 MB
in use at exit, and a peak of 926 -> 829 MiB with the trim (docs/memory-and-speed.md). `trimmed_heap()` trims every
`INTERVAL_S` while the first call of a compiled graph (compile and first run) is under way, and once after it; the
steps after it run without the thread. No-op without glibc; MMRUN_MS_HEAP_TRIM=0 switches it off (to measure).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Iterator

INTERVAL_S = 0.1
TRIM_VAR = "MMRUN_MS_HEAP_TRIM"


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc's; other C libraries have none
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim() if os.environ.get(TRIM_VAR) != "0" else None


@contextlib.contextmanager
def trimmed_heap() -> Iterator[None]:
    """Run the body with the C heap trimmed every INTERVAL_S seconds (a daemon thread; ctypes releases the GIL)."""
    if _TRIM is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(INTERVAL_S):
            _TRIM(0)

    thread = threading.Thread(target=loop, name="mmrun-heap-trim", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _TRIM(0)
