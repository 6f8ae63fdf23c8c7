"""Linear layers of CPU decode steps through the packed kernel of linear.c: ``pack``, ``linear``.

Why: see linear.c (a few dozen token rows through a weight packed once). linear_plan.py
decides, per token count, whether this kernel, the BLAS or the BLAS's other operand order
runs; nothing calls the kernel unless the plan measured it faster on this machine.

Contract:
- ``pack(weight)``: ``weight [N, K]`` float32 on the CPU -> packed ``[ceil(N/32), K, 32]``
  (panel p holds output columns 32p .. 32p+31 for each k, zero past N), or None where the
  kernel is not in use (``status``) or the weight is outside the contract. The weight is
  not changed.
- ``linear(x, packed, n, portable=False)``: ``x [M, K]`` float32 (last axis contiguous,
  any row stride) -> ``[M, n]`` = ``x @ W^T`` of the weight ``packed`` was made from, summed
  in k order: equal to ``F.linear`` within float32 rounding, not bit for bit. ValueError
  when ``x`` does not fit ``packed``; RuntimeError when the kernel is not in use.
  ``portable=True`` runs the plain-C path whatever the CPU (the tests' reference).
- ``status()``: ``"packed kernel (AVX-512)"`` or ``"BLAS (why)"``, decided once per process.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from stages.decoding.backends.cpu_native import build

SOURCE = Path(__file__).with_suffix(".c")
PANEL = 32  # output columns per packed panel (linear.c)


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_fast_path.restype = ctypes.c_int
    lib.ld_pack_weight.restype = None
    lib.ld_pack_weight.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int]
    for fn in (lib.ld_linear_packed, lib.ld_linear_packed_portable):
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_int]


build_library, _kernel_choice = build.kernel_functions(
    SOURCE, _bind, "BLAS", on="packed kernel (AVX-512)",
    without_avx512="no AVX-512 on this CPU: the portable path is not faster than the BLAS", what="CPU linear layers")


def status() -> str:
    """What routed CPU linear layers may run: 'packed kernel (AVX-512)' or 'BLAS (why)'."""
    return _kernel_choice()[1]


def available() -> bool:
    """True where ``pack`` returns packed weights (the kernel is built and in use)."""
    return _kernel_choice()[0] is not None


def _pack_with(lib: ctypes.CDLL, weight: torch.Tensor) -> torch.Tensor | None:
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    w = weight.detach()
    if w.stride(1) != 1:
        w = w.contiguous()
    n, k = w.shape
    packed = torch.empty(((n + PANEL - 1) // PANEL, k, PANEL), dtype=torch.float32)
    lib.ld_pack_weight(w.data_ptr(), n, k, w.stride(0), packed.data_ptr(), torch.get_num_threads())
    return packed


def pack(weight: torch.Tensor, portable: bool = False) -> torch.Tensor | None:
    """``weight [N, K]`` float32 -> packed ``[ceil(N/32), K, 32]``, or None (module contract)."""
    lib = build_library() if portable else _kernel_choice()[0]
    return None if lib is None else _pack_with(lib, weight)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, portable: bool = False) -> torch.Tensor:
    """``x [M, K]`` float32 -> ``[M, n]`` through the packed weight (module contract)."""
    lib = build_library() if portable else _kernel_choice()[0]
    if lib is None:
        raise RuntimeError(f"the CPU linear kernel is not in use: {status()}")
    m, k = x.shape
    if x.dtype != torch.float32 or packed.shape[1] != k or packed.shape[0] * PANEL < n or x.stride(1) != 1:
        raise ValueError(f"linear: x {tuple(x.shape)} {x.dtype} does not fit packed {tuple(packed.shape)} for N = {n}")
    y = torch.empty((m, n), dtype=torch.float32)
    run = lib.ld_linear_packed_portable if portable else lib.ld_linear_packed
    rc = run(x.data_ptr(), m, k, x.stride(0), packed.data_ptr(), n, y.data_ptr(), n, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"the CPU linear kernel failed ({rc})")
    return y
