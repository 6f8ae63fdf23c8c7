"""RMSNorm and the gated MLP's activation in one pass each on CPU (cpu_fused.c).

Why: transformers runs a Llama-style RMSNorm as five tensor ops and the MLP's
``silu(gate) * up`` as two, each a pass over megabytes of activations. On the embedded
model a 1,060-token prefill runs 61 norms and 30 activations; on the 2-core Xeon
(2026-11-27, two threads, isolated) a norm took 0.50 ms against the kernel's 0.12 ms and
an activation 0.94 ms against 0.48 ms: ~37 ms of a ~1.3 s prefill.

Contract:
- ``fuse_elementwise(view)``: in a decode view the caller owns (forward.decode_view), every
  RMSNorm module (a ``weight`` of the last axis and a ``variance_epsilon``, the forward
  transformers' Llama, Mistral, Qwen2 and their kin share) and every gated MLP
  (``gate_proj``, ``up_proj``, ``down_proj`` and a SiLU ``act_fn``) computes through the
  kernels for float32 CPU inputs and through its own forward otherwise. Returns how many
  modules it changed; 0 where the kernels are not in use (``status()`` says why). Results
  equal transformers' within float32 rounding (another summation order for the norm's
  mean, ~2 ulp for the exponential), not bit for bit: the CPU backend applies it where it
  applies the measured linear plan (models large enough for either to matter), so tiny
  models keep transformers' ops bit for bit.
- ``status()``: ``"kernel (AVX-512)"`` or ``"torch ops (why)"``; ``LONGDOC_CPU_FUSED=torch``
  turns the kernels off (e.g. to compare).
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


def _bind(lib: ctypes.CDLL) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ld_rms_norm.restype = ctypes.c_int
    lib.ld_rms_norm.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_float, ptr, ctypes.c_int]
    lib.ld_silu_mul.restype = ctypes.c_int
    lib.ld_silu_mul.argtypes = [ptr, ptr, ptr, i64, ctypes.c_int]


@functools.cache
def _kernel_choice() -> tuple[ctypes.CDLL | None, str]:
    """(library or None, status line), decided once per process (a lazily built constant)."""
    choice = native.choose(SOURCE, "LONGDOC_CPU_FUSED", "torch", "torch ops", _bind)
    log.info("CPU norms and activations: %s", choice[1])
    return choice


def status() -> str:
    """What fused modules compute with: 'kernel (AVX-512)' or 'torch ops (why)'."""
    return _kernel_choice()[1]


def _fits(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad and x.stride(-1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., dim]`` float32 -> ``weight * (x * rsqrt(mean(x^2) + eps))`` by the kernel."""
    lib = _kernel_choice()[0]
    dim = x.shape[-1]
    x2 = x.reshape(-1, dim)  # a view where the leading axes allow it; the kernel takes a row stride
    out = torch.empty(x2.shape, dtype=torch.float32)
    lib.ld_rms_norm(x2.data_ptr(), x2.shape[0], dim, x2.stride(0), weight.data_ptr(), float(eps), out.data_ptr(),
                    torch.get_num_threads())
    return out.view(x.shape)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (same shapes, contiguous float32) by the kernel."""
    lib = _kernel_choice()[0]
    out = torch.empty_like(gate)
    lib.ld_silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(), torch.get_num_threads())
    return out


class FusedRMSNorm(torch.nn.Module):
    """A transformers RMSNorm whose float32 CPU forward runs the kernel (same weight tensor)."""

    weight: torch.nn.Parameter
    variance_epsilon: float

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if _fits(hidden_states) and w.dtype == torch.float32 and w.is_contiguous() and hidden_states.dim() >= 1:
            return rms_norm(hidden_states, w, self.variance_epsilon)
        return self._stock_forward(hidden_states)


class FusedGatedMLP(torch.nn.Module):
    """A transformers gated MLP whose float32 CPU activation runs the kernel (same layers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if _fits(gate) and _fits(up) and gate.is_contiguous() and up.is_contiguous() and gate.shape == up.shape:
            return self.down_proj(silu_mul(gate, up))
        return self.down_proj(self.act_fn(gate) * up)


def _same_code(f, g) -> bool:
    """True when two functions are the same code: transformers copies Llama's RMSNorm and MLP
    forwards into Mistral, Qwen2 and others ("Copied from"), so their bytecode is the same."""
    cf, cg = getattr(f, "__code__", None), getattr(g, "__code__", None)
    return cf is not None and cg is not None and (cf.co_code, cf.co_names, cf.co_consts) == (
        cg.co_code, cg.co_names, cg.co_consts)


def _is_rms_norm(m: torch.nn.Module, reference) -> bool:
    """Llama's RMSNorm by its forward's code (Gemma's ``1 + weight`` and the like are not)."""
    w = getattr(m, "weight", None)
    return (
        _same_code(type(m).forward, reference) and isinstance(w, torch.Tensor) and w.dim() == 1
        and isinstance(getattr(m, "variance_epsilon", None), float)
    )


def _is_gated_silu_mlp(m: torch.nn.Module, reference) -> bool:
    """Llama's gated MLP by its forward's code, with SiLU as its activation."""
    act = getattr(m, "act_fn", None)
    # transformers' SiLU is its own SiLUActivation (nn.functional.silu); torch's nn.SiLU is the same function
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and _same_code(type(m).forward, reference)


def _fused_class(mixin: type, base: type) -> type:
    """``mixin``'s forward over ``base``; the norm keeps base's own forward as
    ``_stock_forward`` for inputs outside the kernel's contract."""
    return type(f"Fused{base.__name__}", (mixin, base), {"_stock_forward": base.forward})


def fuse_elementwise(view: torch.nn.Module) -> int:
    """Route ``view``'s RMSNorms and gated SiLU MLPs through the kernels (module contract)."""
    if _kernel_choice()[0] is None:
        return 0
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    changed = 0
    made: dict[type, type] = {}  # one fused class per module class of this view
    for m in view.modules():
        if isinstance(m, (FusedRMSNorm, FusedGatedMLP)):
            continue  # fused already
        mixin = (FusedRMSNorm if _is_rms_norm(m, LlamaRMSNorm.forward)
                 else FusedGatedMLP if _is_gated_silu_mlp(m, LlamaMLP.forward) else None)
        if mixin is not None:
            base = type(m)
            if base not in made:
                made[base] = _fused_class(mixin, base)
            m.__class__ = made[base]
            changed += 1
    return changed
