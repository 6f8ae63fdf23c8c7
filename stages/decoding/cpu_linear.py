"""Linear layers of CPU decode steps through a kernel of our own (cpu_linear.c).

Why: a decode step feeds ``M = rows x width`` tokens (a few to a few hundred) through every
linear layer, where the BLAS repacks each weight on every call and reaches a fraction of
the CPU's rate. With the weight packed once into 32-column panels, the kernel reads each
weight byte once per call and keeps its arithmetic near the rate it reaches in cache. The
embedded model's body linears (210 weights, 424 MB in float32), two threads, stock
``F.linear`` against the kernel in ms (2026-11-27, Intel Xeon, one run, machine noisy):
M = 8: 46-52 / 30-34; 16: 55-62 / 37-40; 39: 74-93 / 55-72; 64: 100-105 / 72-80; the
lm_head (49152 x 576) at M = 39: 17-20 / 11-13. At M = 1 both read the weights at the
DRAM rate (same time); from a few hundred rows on, the BLAS is faster (M = 256: 300 / 322).
Which M it serves is measured per machine by linear_plan.py, which routes those M here.

Contract:
- ``pack(weight)``: an ``[N, K]`` float32 weight -> its packed copy ``[ceil(N/32), K, 32]``
  (the kernel's layout; a new tensor, the weight is untouched), or None where the kernel
  is not in use (``status()`` says why) or the weight is not a 2-D float32 tensor on CPU.
- ``linear(x, packed, n)``: ``x [M, K]`` float32 (last axis contiguous) -> ``[M, n]`` =
  ``x @ W^T`` of the weight ``packed`` was made from (``n`` = its N), summed in k order
  with fused multiply-adds: equal to ``F.linear`` within float32 rounding, not bit for bit.
- ``status()``: ``"kernel (AVX-512)"`` or ``"BLAS (why)"``; decided once per process. The
  kernel is used only where it was built with AVX-512; ``LONGDOC_CPU_LINEAR=blas`` turns
  it off (e.g. to compare), as do a missing compiler or a failed build.
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
PANEL = 32  # output columns per packed panel (cpu_linear.c)


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_pack_weight.restype = None
    lib.ld_pack_weight.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int]
    lib.ld_linear_packed.restype = ctypes.c_int
    lib.ld_linear_packed.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_int]


@functools.cache
def _kernel_choice() -> tuple[ctypes.CDLL | None, str]:
    """(library or None, status line), decided once per process (a lazily built constant)."""
    choice = native.choose(SOURCE, "LONGDOC_CPU_LINEAR", "blas", "BLAS", _bind)
    log.info("CPU linear layers: %s", choice[1])
    return choice


def status() -> str:
    """What routed CPU linear layers can run: 'kernel (AVX-512)' or 'BLAS (why)'."""
    return _kernel_choice()[1]


def available() -> bool:
    """True where ``pack`` returns packed weights (the kernel is built and in use)."""
    return _kernel_choice()[0] is not None


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight [N, K]`` float32 -> packed ``[ceil(N/32), K, 32]``, or None (module contract)."""
    lib = _kernel_choice()[0]
    if lib is None or weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    w = weight.detach()
    if w.stride(1) != 1:
        w = w.contiguous()
    n, k = w.shape
    packed = torch.empty(((n + PANEL - 1) // PANEL, k, PANEL), dtype=torch.float32)
    lib.ld_pack_weight(w.data_ptr(), n, k, w.stride(0), packed.data_ptr(), torch.get_num_threads())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """``x [M, K]`` float32 -> ``[M, n]`` through the packed weight (module contract)."""
    lib = _kernel_choice()[0]
    if lib is None:
        raise RuntimeError(f"the CPU linear kernel is not in use: {status()}")
    m, k = x.shape
    if x.dtype != torch.float32 or packed.shape[1] != k or packed.shape[0] * PANEL < n or x.stride(1) != 1:
        raise ValueError(f"linear: x {tuple(x.shape)} {x.dtype} does not fit packed {tuple(packed.shape)} for N = {n}")
    y = torch.empty((m, n), dtype=torch.float32)
    rc = lib.ld_linear_packed(x.data_ptr(), m, k, x.stride(0), packed.data_ptr(), n, y.data_ptr(), n,
                              torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"the CPU linear kernel failed ({rc})")
    return y
