"""CPU attention through kernels of our own (cpu_attention.c): ``attend`` (decode steps)
and ``attend_causal`` (prefill chunks).

Why: on CPU a decode step's attention reads every active row's keys and values once;
SDPA's flash kernel does that at about half the machine's DRAM rate, and it is most of a
step (the embedded model in fp32 at 39 rows of ~1,140 tokens: 58% of a 328 ms step,
Intel Xeon, two threads, 2026-11-27). The kernel reads each (row, KV head)'s keys once
for all the queries that share them, then its values once, and stops at the row's last
visible key (a row shorter than the step's span reads only its own slots).

Contract: ``attend(query, key, value, mask, scale)`` with query ``[B, G, R, D]`` (the
``R = heads per KV head x T`` packed rows of forward.packed_gqa_sdpa; row r is step
token ``r % T``), key ``[B, G, S, D]`` / value ``[B, G, S, Dv]`` (float32 or bfloat16,
last axis contiguous), mask ``[B, T, L]`` bool (``L <= S``: query token t of row b sees
key j iff ``mask[b, t, j]``) returns ``[B, G, R, Dv]`` in the query's dtype: the same as
SDPA with that mask, softmax in float32 (within a few float32 ulps of SDPA, not bit for
bit: another summation order). It returns None when the kernel is not in use (see
``status``), the inputs are outside its contract, or ``R`` exceeds ``MAX_QUERY_ROWS`` of
its dtype (wide verify steps, where SDPA is faster); the caller then runs SDPA.

Prefill chunks: a prefill's attention is compute-bound, and SDPA's causal flash kernel runs
it at about half the rate of the model's matrix products. ``attend_causal(query, key,
value, scale)`` with query ``[1, Hq, T, D]`` (any strides, last axis contiguous; the chunk's
T tokens sit at positions ``S - T .. S - 1``) and key/value ``[1, Hkv, S, D]`` returns the
causal attention ``[1, T, Hq, D]`` contiguous (query t sees keys ``j <= S - T + t``),
float32 only, ``D`` a multiple of 16 up to 128, or None (SDPA's turn). Measured on the
embedded model's shapes (9/3 heads of 64, two threads, 2026-11-27, Xeon), kernel against
SDPA: a first chunk of 1,060 tokens 7.5 / 9.9 ms a layer; 512 tokens after 548 cached
(SDPA with a mask) 5.5 / 8.7 ms. Within ~5e-7 of SDPA (another summation order).

Build: the C source is compiled once per machine and cached (native.py: ``-O3
-march=native -fopenmp``; its OpenMP threads are torch's). The kernel is used only where it
was built with AVX-512 (the fast path measured above); elsewhere, without a compiler, or
with ``LONGDOC_CPU_ATTENTION=sdpa`` (e.g. to compare), SDPA runs and ``status()`` says why
(also in the engine's description line).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from stages.decoding import native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".c")
# Query rows per KV head (heads sharing it x step width) up to which the kernel is faster:
# it computes each row's scores one by one, SDPA in blocks, so past a few rows the kernel's
# arithmetic, not the memory it reads, sets its time. 8 rows of ~1,100 keys, 30 layers,
# one thread, alternated (2026-11-27, Xeon), kernel against SDPA in ms:
#   float32:  width 1 (3 rows) 44 / 68, 4 (12 rows) 69 / 99, 8 (24) 120 / 123, 17 (51) 221 / 207
#   bfloat16: width 1 28 / 46, 2 (6) 35 / 48, 3 (9) 44 / 49, 4 (12) 54 / 52, 8 (24) 112 / 69
# Wider steps (and every prefill chunk) keep SDPA.
MAX_QUERY_ROWS = {torch.float32: 16, torch.bfloat16: 9}
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_fast_path.restype = ctypes.c_int
    lib.ld_attend.restype = ctypes.c_int
    lib.ld_attend.argtypes = [ptr] * 5 + [i64] * 13 + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int]
    lib.ld_attend_causal.restype = ctypes.c_int
    lib.ld_attend_causal.argtypes = [ptr] * 4 + [i64] * 13 + [ctypes.c_float, ctypes.c_int]


def build_library() -> ctypes.CDLL:
    """The kernel library, compiled into the cache on first use (native.py), whatever the CPU
    (tests call its portable path too).

    Raises RuntimeError (no compiler, a failed build) or OSError (unloadable)."""
    lib = native.load_library(SOURCE)
    _bind(lib)
    return lib


@functools.cache
def _kernel_choice() -> tuple[ctypes.CDLL | None, str]:
    """(library or None, status line), decided once per process: a lazily built constant
    (the environment and the machine do not change under a running process)."""
    choice = native.choose(SOURCE, "LONGDOC_CPU_ATTENTION", "sdpa", "SDPA", _bind, on="kernels (AVX-512)",
                           without_avx512="no AVX-512 on this CPU: the portable kernel is not faster than SDPA")
    log.info("CPU attention: %s", choice[1])
    return choice


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, built on first use; None where SDPA runs instead (see ``status``)."""
    return _kernel_choice()[0]


def status() -> str:
    """What CPU decode steps and prefill chunks attend with: 'kernels (AVX-512)' or 'SDPA (why)'."""
    return _kernel_choice()[1]


def run_kernel(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    lib: ctypes.CDLL, portable: bool = False,
) -> torch.Tensor:
    """The kernel's call (see the module contract; inputs already checked by ``attend``).
    ``portable`` runs its plain-C path (tests compare both paths with SDPA)."""
    b, g, r, d = query.shape
    dv = value.shape[-1]
    t, span = mask.shape[1], mask.shape[2]
    q = query.to(torch.float32).contiguous()
    m = mask.contiguous().view(torch.uint8)
    out = torch.empty((b, g, r, dv), dtype=torch.float32)
    rc = lib.ld_attend(
        q.data_ptr(), key.data_ptr(), value.data_ptr(), m.data_ptr(), out.data_ptr(),
        b, g, r, d, dv, t, span, *key.stride()[:3], *value.stride()[:3],
        _DTYPES[key.dtype], float(scale), torch.get_num_threads(), int(portable),
    )
    if rc != 0:
        raise MemoryError("the CPU attention kernel could not allocate its scratch memory")
    return out.to(query.dtype)


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """Attention of a decode step by the kernel (module contract), or None: use SDPA."""
    lib = library()
    if (
        lib is None
        or query.device.type != "cpu"
        or mask.dtype != torch.bool
        or mask.dim() != 3
        or key.dtype not in _DTYPES
        or query.shape[2] > MAX_QUERY_ROWS[key.dtype]
        or value.dtype != key.dtype
        or key.stride(-1) != 1
        or value.stride(-1) != 1
        or query.requires_grad
        or mask.shape[0] != query.shape[0]
        or mask.shape[2] > key.shape[2]
        or query.shape[2] % mask.shape[1]
    ):
        return None
    return run_kernel(query, key, value, mask, scale, lib)


def attend_causal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor | None:
    """Causal attention of a prefill chunk by the kernel (module contract), or None: use SDPA."""
    lib = library()
    if (
        lib is None
        or query.device.type != "cpu"
        or not (query.dtype == key.dtype == value.dtype == torch.float32)
        or query.dim() != 4
        or query.shape[0] != 1
        or key.shape[0] != 1
        or query.shape[1] % key.shape[1]
        or query.shape[2] > key.shape[2]
        or query.shape[3] % 16
        or query.shape[3] > 128
        or value.shape[3] != query.shape[3]
        or key.shape[3] != query.shape[3]
        or query.stride(-1) != 1
        or key.stride(-1) != 1
        or value.stride(-1) != 1
        or query.requires_grad
    ):
        return None
    _, hq, t, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    out = torch.empty((1, t, hq, d), dtype=torch.float32)
    rc = lib.ld_attend_causal(
        query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(),
        hkv, hq // hkv, t, s - t, d, query.stride(1), query.stride(2), key.stride(1), key.stride(2),
        value.stride(1), value.stride(2), out.stride(1), out.stride(2), float(scale), torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError("the CPU causal attention kernel could not allocate its scratch memory")
    return out
