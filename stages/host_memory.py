"""Keep freed host memory in the process for the next forward pass: ``keep_freed_memory``.

Why: glibc's malloc hands out blocks above its mmap threshold (128 KiB at start,
raised as large blocks are freed, at most 32 MiB) as fresh pages from the kernel and
gives them back on free; it also returns the free top of its heap to the kernel once
that exceeds a trim threshold (twice the mmap threshold). A CPU forward pass allocates
and frees blocks of the same few MB again and again (a prefill chunk's activations:
1,077 tokens x 1,536 floats = 6.6 MB per MLP tensor on SmolLM2-135M), so many of them
come back as new pages that the kernel must zero and map one 4 KiB fault at a time.
Keeping them removes those faults and speeds the elementwise operations of one prefill;
in a whole job the gain was within a shared machine's noise (measured:
jobs/results/code-choices.md, "stages/host_memory.py").

Contract: ``keep_freed_memory()`` fixes the mmap threshold at glibc's largest value
(32 MiB) and the trim threshold at ``TRIM_BYTES`` (1 GiB) with ``mallopt``, for the
whole process, and returns a one-line description; it returns None and changes
nothing where glibc's ``mallopt`` is missing (macOS, musl), where the user chose
(``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment: glibc has
read them already), or with ``LONGDOC_KEEP_FREED_MEMORY=0``. Calling it again is
harmless. It is a process setting, so it is called by whoever owns the process: the
generate stage on CPU (a Ray actor, or the in-process runner's one process).

Cost: up to ``TRIM_BYTES`` of freed heap stays mapped (memory the process held at its
peak anyway); blocks of 32 MiB and more (KV slots, weights) are still mapped on their
own and returned on free, so a relayout of the KV cache still gives memory back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc's mallopt parameter numbers (malloc.h) and the largest mmap threshold it takes
# on a 64-bit build (HEAP_MAX_SIZE / 2); a larger value is refused (mallopt returns 0).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20
TRIM_BYTES = 1 << 30
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _mallopt():
    """glibc's ``mallopt`` as a ctypes function, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
    except OSError:
        return None
    fn = getattr(libc, "mallopt", None)
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory() -> str | None:
    """Apply the allocator settings of the module docstring; a description, or None if not applied."""
    if os.environ.get("LONGDOC_KEEP_FREED_MEMORY", "1") == "0":
        return None
    if any(name in os.environ for name in _USER_SETTINGS):
        return None  # the user tuned malloc for this process: theirs stands
    mallopt = _mallopt()
    if mallopt is None:
        return None
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)):
        return None
    return f"malloc keeps freed blocks below {MMAP_THRESHOLD_MAX >> 20} MiB (trims above {TRIM_BYTES >> 20} MiB)"
