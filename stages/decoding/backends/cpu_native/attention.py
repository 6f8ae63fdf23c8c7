"""CPU attention through the kernels of attention.c: ``attend_causal`` (prefill chunks) and
``attend`` (decode and narrow verify steps over the KV slots).

Why: a prefill's attention is compute-bound, and SDPA's causal flash kernel runs it at about
half the rate of the model's matrix products; a decode step's attention is two streaming
passes over each row's keys and values, which SDPA's flash kernel runs at about half the
memory rate. In the whole sample night the causal kernel saved 13% on an Intel Xeon and the
decode kernel 5.5% on an AMD EPYC, both with AVX-512 (jobs/results/cpu-kernels/README.md).

Contract:
- ``attend_causal(query, key, value, scale, portable=False)`` with query ``[1, Hq, T, D]``
  (any strides, last axis contiguous; the chunk's T tokens sit at positions ``S - T .. S -
  1``) and key/value ``[1, Hkv, S, D]`` returns the causal attention ``[1, T, Hq, D]``
  contiguous (query t sees keys ``j <= S - T + t``), float32 only, ``D`` a multiple of 16
  up to 128; within ~5e-7 of SDPA (another summation order).
- ``attend(query, key, value, mask, scale, portable=False)`` with query ``[B, G, R, D]`` (the
  ``R = heads per KV head x T`` packed rows; row r is step token ``r % T``), key ``[B, G, S,
  D]`` / value ``[B, G, S, Dv]`` (float32 or bfloat16, last axis contiguous), mask ``[B, T,
  L]`` bool (``L <= S``: query token t of row b sees key j iff ``mask[b, t, j]``) returns
  ``[B, G, R, Dv]`` in the query's dtype: SDPA with that mask, softmax in float32 (within a
  few float32 ulps, not bit for bit). ``R`` is at most ``MAX_QUERY_ROWS`` of the dtype (wider
  steps are faster on SDPA).
- Both return None for inputs outside their contract or where the kernel is not in use
  (``status``): the caller then runs SDPA. ``portable=True`` runs the plain-C paths of the
  same library whatever the CPU (tests hold both paths to SDPA on every machine).

In use (``status``): where a C compiler built the library (build.py, once per machine,
~0.5 s) and the CPU has AVX-512 (the paths the nights were measured with; the portable
paths are correct everywhere but not faster than SDPA, so they are not used for work).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from stages.decoding.backends.cpu_native import build

SOURCE = Path(__file__).with_suffix(".c")
# Query rows per KV head (heads sharing it x step width) up to which the decode kernel is
# faster: it computes each row's scores one by one, SDPA in blocks, so past a few rows its
# arithmetic, not the memory it reads, sets its time (the measurements:
# jobs/results/code-choices.md, this module's section). Wider steps keep SDPA.
MAX_QUERY_ROWS = {torch.float32: 16, torch.bfloat16: 9}
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_fast_path.restype = ctypes.c_int
    for fn in (lib.ld_attend_causal, lib.ld_attend_causal_portable):
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr] * 4 + [i64] * 13 + [ctypes.c_float, ctypes.c_int]
    lib.ld_attend.restype = ctypes.c_int
    lib.ld_attend.argtypes = [ptr] * 5 + [i64] * 13 + [ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_int]


build_library, _kernel_choice = build.kernel_functions(
    SOURCE, _bind, "SDPA", on="causal kernel (AVX-512)",
    without_avx512="no AVX-512 on this CPU: the portable path is not faster than SDPA", what="CPU prefill attention")


def library() -> ctypes.CDLL | None:
    """The loaded kernel library where it runs; None where SDPA runs instead (see ``status``)."""
    return _kernel_choice()[0]


def status() -> str:
    """What CPU prefill chunks and decode steps attend with: 'causal kernel (AVX-512)' (and the
    decode kernel) or 'SDPA (why)'."""
    return _kernel_choice()[1]


def attend_causal(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, portable: bool = False
) -> torch.Tensor | None:
    """Causal attention of a prefill chunk by the kernel (module contract), or None: use SDPA."""
    lib = build_library() if portable else library()
    if (
        lib is None
        or not (query.dtype == key.dtype == value.dtype == torch.float32)
        or query.is_cuda or query.dim() != 4
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
    run = lib.ld_attend_causal_portable if portable else lib.ld_attend_causal
    rc = run(
        query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(),
        hkv, hq // hkv, t, s - t, d, query.stride(1), query.stride(2), key.stride(1), key.stride(2),
        value.stride(1), value.stride(2), out.stride(1), out.stride(2), float(scale), torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError("the CPU causal attention kernel could not allocate its scratch memory")
    return out


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
    portable: bool = False,
) -> torch.Tensor | None:
    """Attention of a decode or narrow verify step by the kernel (module contract), or None: use SDPA."""
    lib = build_library() if portable else library()
    if (
        lib is None
        or query.device.type != "cpu"
        or mask.dtype != torch.bool
        or mask.dim() != 3
        or query.dim() != 4
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
        raise MemoryError("the CPU decode attention kernel could not allocate its scratch memory")
    return out.to(query.dtype)
