"""The torch eager backend: PyTorch's own kernels, exact shapes, on CPU and any other device.

The backend for a CPU without the native kernel (cpu_native/), and for devices without a
backend of their own (mps, xpu, ...: eager steps, a wall clock after the device's own
synchronise, the accelerator cost prior). Where ``generation.compile`` asks for inductor
it compiles the step (bucketed shapes); ``auto`` stays eager (base.StepBackend.compile_plan).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from stages.decoding.adaptive import default_cost_prior
from stages.decoding.backends.base import Attention, StepBackend
from stages.decoding.forward import packed_gqa_sdpa
from stages.host_memory import keep_freed_memory

#: transformers' switch for its SDPA path (integrations/sdpa_attention.py): "1" hands
#: SDPA the KV heads as they are (``enable_gqa``) even with a mask.
GROUPED_SDPA_ENV = "TRANSFORMERS_SDPA_FORCE_GQA"


def grouped_heads_in_sdpa() -> str | None:
    """Let transformers' SDPA path pass grouped KV heads to torch's CPU kernel as they are,
    for the whole process (the model forwards of the methods' own readings: Finch, select
    and their scorer); a one-line description, or None where the user set the switch.

    Why: with a mask (every pass of a Finch reading has one), transformers copies each
    layer's keys and values out to one head per query head (``repeat_kv``) before SDPA,
    unless told the device's kernel takes grouped heads; torch's CPU kernel does. The
    copy grows with the rows of a pass: reading a document once for its three questions,
    the question pass's copies took about a third of that pass (jobs/results/code-choices.md,
    "stages/decoding/backends/torch_eager.py grouped_heads_in_sdpa"). The kernel reads the
    same values either way: the reading's results are bitwise the same
    (tests/stages/decoding/backends/test_torch_eager.py). Not for CUDA: there its fused
    kernels take no mask with grouped heads, and transformers' default is right.
    """
    if GROUPED_SDPA_ENV in os.environ:
        return None
    os.environ[GROUPED_SDPA_ENV] = "1"
    return "SDPA takes grouped KV heads (no repeat_kv copy)"


def host_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """forward.packed_gqa_sdpa, where reading the mask on the host is free (eager CPU steps).

    A layer with a sliding window reads only the slots from the earliest query's window on
    (a long row's windowed layers attend over the window, not the whole row). A one-token
    step whose span every row sees whole (rows of equal length, e.g. batch 1) attends
    without a mask: SDPA then runs a faster kernel (measured:
    jobs/results/code-choices.md, "stages/decoding/backends/torch_eager.py host_attention").
    Not for devices that would synchronise to read the mask, nor compiled steps.
    """
    window = kwargs.get("sliding_window")
    if (
        window is not None and attention_mask is not None and attention_mask.shape[-1] > window
        and not torch.compiler.is_compiling()
    ):
        span = attention_mask.shape[-1]
        cols = torch.arange(span, device=attention_mask.device)
        earliest = int(torch.where(attention_mask, cols, -1).amax(dim=-1).min())  # the lowest query slot
        # No query sees a slot before the earliest one's window (each keeps its own slot).
        start = max(0, earliest - int(window) + 1)
        if start > 0:
            key, value, attention_mask = key[:, :, start:span], value[:, :, start:span], attention_mask[..., start:]
    if (
        attention_mask is not None and query.shape[2] == 1 and not torch.compiler.is_compiling()
        and bool(attention_mask.all())
    ):
        span = attention_mask.shape[-1]
        key, value, attention_mask = key[:, :, :span], value[:, :, :span], None
    return packed_gqa_sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


class TorchEagerBackend(StepBackend):
    """PyTorch's kernels on CPU or any torch device (see the module docstring)."""

    name = "torch"
    summary = "PyTorch's own kernels, eager steps of exact shapes (CPU and any other torch device)"
    priority = 0

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device | str,
        compile: str | bool | None = "off",
        compile_backend: Callable | None = None,
        min_span: int = 256,
    ) -> None:
        device = torch.device(device)
        self.on_host = self.runs_on_host(device)
        super().__init__(model, device, compile, compile_backend, min_span)
        # One torch thread: the forward runs on the calling thread, so its CPU time is the
        # step's cost (leaves out other processes' bursts); with more, the work is spread
        # over a pool and only wall time covers it. Fixed now (the actor sets its threads first).
        self._timer = time.thread_time if self.on_host and torch.get_num_threads() == 1 else time.perf_counter
        if self.on_host:
            # CPU memory is zero-filled (touched) when allocated: start with a few slots and
            # add them as rows wait (relayouts are cheap copies on the host). Indexed
            # assignment writes the same bytes as scatter_, but on CPU scatter_ on a bfloat16
            # slot tensor rewrites the whole tensor, hundreds of times slower (measured:
            # jobs/results/code-choices.md, "stages/decoding/backends/torch_eager.py").
            self.grows_slots = True
            self.indexed_slot_writes = True

    @classmethod
    def claims(cls, device: torch.device, compile: str) -> bool:
        return device.type != "cuda"

    @classmethod
    def prepare_process(cls, device: torch.device, num_cpus: float | None) -> str | None:
        """On CPU, one actor per node slice: torch uses the CPUs Ray granted it, not every core
        (None: torch's own default, the machine's cores or ``OMP_NUM_THREADS``);
        activations freed by one forward pass are reused by the next instead of
        page-faulted back in (host_memory.py, with what it measured); and transformers'
        SDPA path hands grouped KV heads to the kernel without copying them out
        (``grouped_heads_in_sdpa``)."""
        if device.type != "cpu":
            return None
        if num_cpus is not None:
            torch.set_num_threads(max(1, int(num_cpus)))
        said = [f"host memory: {allocator}" if (allocator := keep_freed_memory()) else None, grouped_heads_in_sdpa()]
        return "; ".join(x for x in said if x) or None

    def attention(self, model: torch.nn.Module) -> Attention:
        return host_attention if self.on_host and not self.compiled else packed_gqa_sdpa

    @classmethod
    def synchronize_device(cls, device: torch.device) -> None:
        if device.type != "cpu":
            getattr(torch, device.type).synchronize()  # mps, xpu, ...

    def clock(self) -> float:
        self.synchronize()
        return self._timer()

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior(accelerator=not self.on_host)

    def describe(self) -> str:
        if not self.on_host:
            return super().describe()
        return f"{super().describe()}, {torch.get_num_threads()} thread(s), clock {self._timer.__name__}"
