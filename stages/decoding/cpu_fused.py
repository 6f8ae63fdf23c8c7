"""RMSNorm, the gated MLP's activation and RoPE in one pass each on CPU (cpu_fused.c).

Why: transformers runs a Llama-style RMSNorm as five tensor ops and the MLP's
``silu(gate) * up`` as two, each a pass over megabytes of activations. On the embedded
model a 1,060-token prefill runs 61 norms and 30 activations; on the 2-core Xeon
(2026-11-27, two threads, isolated) a norm took 0.50 ms against the kernel's 0.12 ms and
an activation 0.94 ms against 0.48 ms: ~37 ms of a ~1.3 s prefill. transformers' rotary
embedding (``q * cos + rotate_half(q) * sin`` for queries and keys) is eight more passes
a layer: a profile of the whole sample job (py-spy, 2026-11-27) found ~2.2 s of its ~48 s
of prefill in it.

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
  models keep transformers' ops bit for bit. Every attention module whose forward is Llama's
  own code (Mistral's and others' copies too) gets a copy of that forward that calls
  ``apply_rotary_pos_emb`` below instead of its module's: equal to transformers' bit for bit
  (the same roundings), the kernel for float32 CPU inputs, transformers' function otherwise.
- ``status()``: ``"kernel (AVX-512)"`` or ``"torch ops (why)"``; ``LONGDOC_CPU_FUSED=torch``
  turns the kernels off (e.g. to compare).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import logging
import types
from collections.abc import Callable
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
    lib.ld_rope.restype = ctypes.c_int
    lib.ld_rope.argtypes = [ptr, i64, i64, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, ptr, ctypes.c_int]


@functools.cache
def _kernel_choice() -> tuple[ctypes.CDLL | None, str]:
    """(library or None, status line), decided once per process (a lazily built constant)."""
    choice = native.choose(SOURCE, "LONGDOC_CPU_FUSED", "torch", "torch ops", _bind)
    log.info("CPU norms, activations and RoPE: %s", choice[1])
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


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, T, D]`` (any strides, the last axis unit), ``cos``/``sin`` ``[B or 1, T, D]``
    (last axis unit) float32 -> ``x * cos + rotate_half(x) * sin`` by the kernel, bit for bit
    transformers' values, laid out as transformers lays out its result for a transposed view
    (``[B, T, H, D]`` memory, returned as its ``[B, H, T, D]`` view)."""
    lib = _kernel_choice()[0]
    b, h, t, d = x.shape
    out = torch.empty((b, t, h, d), dtype=torch.float32)
    cb = 0 if cos.shape[0] == 1 else cos.stride(0)
    lib.ld_rope(x.data_ptr(), b, h, t, d, x.stride(0), x.stride(1), x.stride(2), cos.data_ptr(), sin.data_ptr(),
                cb, cos.stride(1), out.data_ptr(), torch.get_num_threads())
    return out.transpose(1, 2)


def _rope_fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """The kernel's contract: float32 CPU, x 4-D of an even head size, cos and sin [B or 1, T, D]
    alike (the shape transformers' rotary embedding returns)."""
    if not (_fits(x) and _fits(cos) and _fits(sin) and x.dim() == 4 and cos.dim() == 3):
        return False
    b, _, t, d = x.shape
    return (d % 2 == 0 and cos.shape == sin.shape and cos.stride() == sin.stride()
            and cos.shape[0] in (1, b) and tuple(cos.shape[1:]) == (t, d))


def make_apply_rotary_pos_emb(stock: Callable) -> Callable:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` through the kernel
    where its inputs fit (``_rope_fits``), through ``stock`` (the module's own) otherwise."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim == 1 and _rope_fits(q, cos, sin) and _rope_fits(k, cos, sin) and q.shape[0] == k.shape[0]:
            return rope(q, cos, sin), rope(k, cos, sin)
        return stock(q, k, cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


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


def _with_global(forward: Callable, name: str, value: object) -> Callable | None:
    """A copy of ``forward`` that reads ``value`` where it reads the global ``name``: the same
    code (inside the same decorator: transformers wraps attention forwards in one,
    deprecate_kwarg) over a copy of its module's namespace, taken now. None where the
    function is wrapped otherwise than once by a closure over it."""
    inner = inspect.unwrap(forward)
    namespace = dict(inner.__globals__)
    namespace[name] = value
    copy = types.FunctionType(inner.__code__, namespace, inner.__name__, inner.__defaults__, inner.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = inner.__kwdefaults__, inner.__qualname__
    if forward is inner:
        return copy
    cells = forward.__closure__ or ()
    holding = [i for i, c in enumerate(cells) if _cell_holds(c, inner)]
    if getattr(forward, "__wrapped__", None) is not inner or len(holding) != 1:
        return None
    closure = tuple(types.CellType(copy) if i == holding[0] else c for i, c in enumerate(cells))
    wrapper = types.FunctionType(forward.__code__, forward.__globals__, forward.__name__, forward.__defaults__, closure)
    wrapper.__kwdefaults__ = forward.__kwdefaults__
    functools.update_wrapper(wrapper, copy)
    return wrapper


def _cell_holds(cell: types.CellType, value: object) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _fused_attention_class(base: type, llama) -> type | None:
    """``base`` (an attention class whose forward is Llama's code, reading Llama's
    ``apply_rotary_pos_emb`` and ``rotate_half`` from its module) with a forward that calls
    the kernel's RoPE; None for any other attention."""
    forward = getattr(base, "forward", None)
    inner = inspect.unwrap(forward) if callable(forward) else None
    if inner is None or not _same_code(inner, inspect.unwrap(llama.LlamaAttention.forward)):
        return None
    stock = inner.__globals__.get("apply_rotary_pos_emb")
    rotate = inner.__globals__.get("rotate_half")
    if not (_same_code(stock, llama.apply_rotary_pos_emb) and _same_code(rotate, llama.rotate_half)):
        return None
    fused = make_apply_rotary_pos_emb(stock)
    if not _agrees(fused, stock):
        log.warning("RoPE not fused: this transformers' apply_rotary_pos_emb computes another formula")
        return None
    rebound = _with_global(forward, "apply_rotary_pos_emb", fused)
    if rebound is None:
        return None
    return type(f"Fused{base.__name__}", (base,), {"forward": rebound, "_longdoc_fused_rope": True})


def _agrees(fused: Callable, stock: Callable) -> bool:
    """The kernel's RoPE equals ``stock`` bit for bit on a small probe in its contract: a guard
    against a transformers version whose function keeps its name but changes its formula."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4 * 2 * 16, generator=gen).view(2, 3, 4, 32).transpose(1, 2)
    k = torch.randn(2, 3, 2 * 32, generator=gen).view(2, 3, 2, 32).transpose(1, 2)
    cos, sin = (torch.randn(2, 3, 32, generator=gen) for _ in range(2))
    return all(torch.equal(a, b) for a, b in zip(fused(q, k, cos, sin), stock(q, k, cos, sin), strict=True))


def fuse_elementwise(view: torch.nn.Module) -> int:
    """Route ``view``'s RMSNorms, gated SiLU MLPs and Llama attentions' RoPE through the
    kernels (module contract)."""
    if _kernel_choice()[0] is None:
        return 0
    from transformers.models.llama import modeling_llama as llama

    changed = 0
    made: dict[type, type] = {}  # one fused norm or MLP class per module class of this view
    attention: dict[type, type | None] = {}  # the same for attentions (None: not Llama's)
    for m in view.modules():
        base = type(m)
        if isinstance(m, (FusedRMSNorm, FusedGatedMLP)) or getattr(base, "_longdoc_fused_rope", False):
            continue  # fused already
        mixin = (FusedRMSNorm if _is_rms_norm(m, llama.LlamaRMSNorm.forward)
                 else FusedGatedMLP if _is_gated_silu_mlp(m, llama.LlamaMLP.forward) else None)
        if mixin is not None:
            if base not in made:
                made[base] = _fused_class(mixin, base)
            fused = made[base]
        else:
            if base not in attention:
                attention[base] = _fused_attention_class(base, llama)
            fused = attention[base]
        if fused is not None:
            m.__class__ = fused
            changed += 1
    return changed
