"""Causal attention of CPU prefill chunks through the kernel of attention.c: ``attend_causal``.

Why: a prefill's attention is compute-bound, and SDPA's causal flash kernel runs it at about
half the rate of the model's matrix products. On the embedded model's shapes (9/3 heads of
64, two threads, Intel Xeon with AVX-512) the kernel's AVX-512 path took a first chunk of
1,060 tokens in 7.5 ms a layer against SDPA's 9.9, and 512 tokens after 548 cached in 5.5
against 8.7 (SDPA with a mask); in the whole sample night it saved 13% (the table in
jobs/results/cpu-kernels/README.md). Within ~5e-7 of SDPA (another summation order).

Contract: ``attend_causal(query, key, value, scale, portable=False)`` with query
``[1, Hq, T, D]`` (any strides, last axis contiguous; the chunk's T tokens sit at positions
``S - T .. S - 1``) and key/value ``[1, Hkv, S, D]`` returns the causal attention
``[1, T, Hq, D]`` contiguous (query t sees keys ``j <= S - T + t``), float32 only, ``D`` a
multiple of 16 up to 128, or None: inputs outside that contract, or the kernel not in use
(``status``): the caller then runs SDPA. ``portable=True`` runs the plain-C path of the
same library whatever the CPU (tests hold both paths to SDPA on every machine).

In use (``status``): where a C compiler built the library (build.py, once per machine,
~0.5 s) and the CPU has AVX-512 (the path the night was measured with; the portable path
is correct everywhere but not faster than SDPA, so it is not used for work).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from stages.decoding.backends.cpu_native import build

SOURCE = Path(__file__).with_suffix(".c")


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_fast_path.restype = ctypes.c_int
    for fn in (lib.ld_attend_causal, lib.ld_attend_causal_portable):
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr] * 4 + [i64] * 13 + [ctypes.c_float, ctypes.c_int]


build_library, _kernel_choice = build.kernel_functions(
    SOURCE, _bind, "SDPA", on="causal kernel (AVX-512)",
    without_avx512="no AVX-512 on this CPU: the portable path is not faster than SDPA", what="CPU prefill attention")


def library() -> ctypes.CDLL | None:
    """The loaded kernel library where it runs; None where SDPA runs instead (see ``status``)."""
    return _kernel_choice()[0]


def status() -> str:
    """What CPU prefill chunks attend with: 'causal kernel (AVX-512)' or 'SDPA (why)'."""
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
