"""The CPU-native backend: the torch eager CPU backend with prefill chunks and decode steps
attending through the C kernels of attention.c (attention.py; build.py compiles it once per
machine), and the decode view's linear layers routed by a plan measured on this CPU
(linear_plan.py: the BLAS, its other operand order, or linear.c's packed kernel, per token
count).

Why these: a CPU kernel stays where it saved at least 5% of the sample night side by side on
the machine that measured it (jobs/results/cpu-kernels/README.md). The causal prefill kernel
saved 13% on an Intel Xeon with AVX-512; on an AMD EPYC with AVX-512 the linear plan with the
packed kernel saved 8% (3% on the Xeon: the plan probes it per machine and routes only where
it wins) and the decode attention kernel 5.5% (0.1% on the Xeon). The fused
norm/activation/RoPE kernels did not pay (1.5%) and are gone.

Chosen (registry.py) for CPU steps, eager (``generation.compile`` auto or off), where the
causal kernel is in use (``attention.status()``: a C compiler and a CPU with AVX-512); the
torch backend runs otherwise. ``warm_up`` measures (or reads from the disk cache) the linear
plan and routes the view before the first step; models too small for it to matter keep the
stock layers bit for bit. The attention kernels are installed on the view only for model
families whose declared structure they were measured and tested with (``KERNEL_FAMILIES``, by
``config.model_type``: plain causal attention over RoPE'd heads, no sliding window or logit
soft-capping); other families keep torch's attention. ``portable=True`` runs the kernels'
plain-C paths whatever the CPU (correct everywhere, slower than SDPA: for tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from stages.decoding.adaptive import default_cost_prior
from stages.decoding.backends.base import Attention, compile_choice
from stages.decoding.backends.cpu_native import attention as kernel
from stages.decoding.backends.cpu_native import linear as packed_kernel
from stages.decoding.backends.cpu_native.linear_plan import LinearPlan, plan_for, route_linears
from stages.decoding.backends.torch_eager import TorchEagerBackend, host_attention

#: config.model_type of the families the kernel was measured and tested with.
KERNEL_FAMILIES = frozenset({"llama"})


def _native(portable: bool) -> Attention:
    def native_attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """A prefill chunk (no mask, T > 1: the engine's own chunks and method prefills that
        pass none) through the causal kernel; a decode or narrow verify step (a boolean mask
        [B, 1, T, L] over the first L slots) through the decode kernel, each row's keys and
        values read once for all the query heads sharing them; everything else, and inputs
        outside the kernels' contracts, through torch_eager.host_attention."""
        # A windowed layer goes to torch's path, which applies the window (forward.windowed).
        if not torch.compiler.is_compiling() and kwargs.get("sliding_window") is None:
            scale = query.shape[-1] ** -0.5 if scaling is None else scaling
            if attention_mask is None and query.shape[2] > 1:
                out = kernel.attend_causal(query, key, value, scale, portable=portable)
                if out is not None:
                    return out, None
            elif attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == 1:
                b, hq, t, d = query.shape
                span, hkv = attention_mask.shape[-1], key.shape[1]
                packed = query.reshape(b, hkv, hq // hkv * t, d)  # row r: head r // t, token r % t
                out = kernel.attend(packed, key[:, :, :span], value[:, :, :span], attention_mask[:, 0], scale,
                                    portable=portable)
                if out is not None:
                    return out.reshape(b, hq, t, -1).transpose(1, 2).contiguous(), None
        return host_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)

    native_attention.__qualname__ = f"native_attention_{'portable' if portable else 'fast'}"
    return native_attention


native_attention = _native(portable=False)
portable_native_attention = _native(portable=True)


class CpuNativeBackend(TorchEagerBackend):
    """CPU eager steps with the causal prefill kernel (see the module docstring)."""

    name = "cpu-native"
    summary = "CPU eager steps; prefill chunks attend through the causal C kernel (AVX-512 CPUs)"
    priority = 5

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device | str = "cpu",
        compile: str | bool | None = "off",
        compile_backend: Callable | None = None,
        min_span: int = 256,
        portable: bool = False,
    ) -> None:
        self.portable = portable
        self.plan: LinearPlan | None = None  # the view's linear plan, once warm_up measured it
        self._warm = False
        super().__init__(model, device, compile, compile_backend, min_span)
        if not self.on_host or self.compiled:
            raise ValueError(f"the {self.name} backend runs eager steps on the CPU, not {self.describe()}")

    @classmethod
    def claims(cls, device: torch.device, compile: str) -> bool:
        eager = cls.compile_plan(compile_choice(compile))[1] is None
        return device.type == "cpu" and eager and kernel.library() is not None

    def attention(self, model: torch.nn.Module) -> Attention:
        if getattr(model.config, "model_type", None) not in KERNEL_FAMILIES:
            return host_attention
        return portable_native_attention if self.portable else native_attention

    def warm_up(self) -> None:
        """Measure (or read from the disk cache) the linear plan and route the view's linear
        layers by it, before the first step (so no step's measured cost includes it); once."""
        if self._warm:
            return
        self._warm = True
        self.plan = plan_for(self.view, self._timer)
        if self.plan is not None:
            route_linears(self.view, self.plan)

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior(accelerator=False, linear_shape=self.plan is not None)

    def cost_shape(self, m: int) -> float:
        return self.plan.shape(m) if self.plan is not None else super().cost_shape(m)

    def describe(self) -> str:
        how = "portable path (tests)" if self.portable else kernel.status()
        if self.plan is None:
            linear = "stock (no plan: weights too small to matter, or before warm-up)"
        else:
            linear = f"plan {{{self.plan.describe()}}}, {packed_kernel.status()}"
        return f"{super().describe()}, prefill attention: {how}, linear layers: {linear}"
