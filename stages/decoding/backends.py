"""How the engine's steps run on one device: the ``StepBackend``s (CPU, CUDA).

The engine's loop (engine.py) is the same on every device; a backend owns what
differs:
- ``view``: the model the steps run (forward.decode_view: the caller's weights in a
  module tree of its own). CPU: every linear layer routed to the BLAS kernel measured
  fastest for its token count (linear_plan.py), measured at ``warm_up``; decode steps
  attend through cpu_attention.py's kernel where it is built (forward.py routes them).
- the shapes of a step: ``batch(n)`` (rows a step computes for ``n`` active rows),
  ``width(t)`` (tokens per row), ``span(need, capacity)`` (slots attention reads),
  ``widths(max_drafts)`` (the widths the width rule may choose; None = any).
  CPU: exact sizes (eager kernels take any shape, and padding is paid for). CUDA:
  buckets, so compiled steps and their CUDA graphs are reused.
- ``clock()``: the clock step cost is measured with (seconds; differences only).
  CPU with one torch thread: this thread's CPU time (leaves out other processes'
  bursts); more threads: wall time. CUDA: wall time after a synchronise.
- ``cost_prior``/``cost_shape``: what adaptive.StepCost starts from.
- ``compile`` choice (CUDA): cudagraphs (the eager step captured as CUDA graphs:
  cuda_graphs.py; the default), inductor with CUDA graphs, or eager.
- ``describe()``: one line for logs and benchmarks.
``backend_for(model, device, compile, ...)`` picks one. Nothing here is process-global:
an engine owns its backend, and a backend what it measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from stages.decoding import cpu_attention, cpu_fused, cpu_linear, native
from stages.decoding.adaptive import default_cost_prior, step_indicator
from stages.decoding.cpu_fused import fuse_elementwise
from stages.decoding.forward import decode_view
from stages.decoding.linear_plan import LinearPlan, plan_for, route_linears
from stages.decoding.slot_step import (
    SlotStep,
    batch_buckets,
    bucket,
    span_buckets,
    width_buckets,
)
from stages.decoding.slots import SlotCache

COMPILE_CHOICES = ("auto", "inductor", "cudagraphs", "off")

log = logging.getLogger(__name__)


def compile_plan(compile: str | bool | None, device: torch.device) -> tuple[str | None, str | None]:
    """(torch.compile mode, backend) for a ``compile`` choice on ``device``; backend None = eager.

    ``auto`` is eager on CPU because inductor was measured slower there: the embedded
    model in fp32 on this project's 2-core AMD EPYC (2026-11-26, 8 fixed slots of 1,536
    tokens, prompts of 1,024 tokens, two threads) stepped at 94-97 ms at batch 1 and
    196-242 ms at batch 8 compiled, against 54-58 ms and 109-113 ms eager with the
    kernel plan, and its first warm-up took 162 s (23 s with the compiler's cache warm).

    ``auto`` is ``cudagraphs`` on CUDA (the eager step captured by hand, cuda_graphs.py):
    it replays the eager step bit for bit and warms up in seconds, where inductor compiles
    for minutes, for a step about as fast at batch 1. Random-weight Llama-3-8B in bf16 on
    an H100 (jobs/results/bench-decode): captured 10.1 ms a step after a 0.8 s warm-up
    (2026-11-27), eager 57 ms; inductor 9.7 ms after 148 s of compilation for batches 1,
    8 and 32 (2026-11-24, an older engine); on an H200 inductor took 66 s for one slot
    (2026-11-26). In a night of 8k-token documents (32 rows, H100, 2026-11-27) captured
    steps took 22.7 ms against 70 ms eager. ``compile: inductor`` stays a choice; a
    night with it is unmeasured.
    """
    choice = {True: "inductor", False: "off", None: "auto"}.get(compile, compile)  # type: ignore[arg-type]
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile {compile!r}: allowed: {', '.join(COMPILE_CHOICES)}")
    if choice == "auto":
        choice = "cudagraphs" if device.type == "cuda" else "off"
    if choice == "off":
        return None, None
    if choice == "cudagraphs":
        if device.type != "cuda":
            raise ValueError(f"compile cudagraphs needs a CUDA device, not {device}; allowed here: inductor, off")
        return None, "cudagraphs"
    return ("reduce-overhead" if device.type == "cuda" else None), "inductor"


class StepBackend:
    """Eager steps with exact shapes on any device (see the module docstring).

    Subclasses: CpuBackend (kernel plan, CPU-time clock), CudaBackend (compiled,
    bucketed shapes). Used as is for other devices (mps, xpu).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        compile: str | bool | None = "off",
        compile_backend: Callable | None = None,
        min_span: int = 256,
    ) -> None:
        self.device = torch.device(device)
        self.view = decode_view(model)
        self.mode, self.compiler = compile_plan(compile, self.device)
        if compile_backend is not None:
            self.compiler = compile_backend
        self.min_span = min_span

    @property
    def compiled(self) -> bool:
        return self.compiler is not None

    def make_step(self, cache: SlotCache) -> SlotStep:
        """The step over ``cache`` (compiled when this backend compiles)."""
        return SlotStep(self.view, cache, self.compiled, self.mode, self.compiler or "inductor", self.min_span)

    # ------------------------------------------------------------------ shapes
    # Compiled steps take bucketed shapes (a handful of graphs, CUDA graphs replayed);
    # eager steps take exact ones (padding would be computed for nothing).
    def batch(self, n: int, slots: int) -> int:
        return bucket(n, batch_buckets(slots)) if self.compiled else n

    def width(self, t: int, max_drafts: int) -> int:
        return bucket(t, width_buckets(max_drafts)) if self.compiled else t

    def widths(self, max_drafts: int) -> tuple[int, ...] | None:
        return width_buckets(max_drafts) if self.compiled else None

    def span(self, need: int, capacity: int) -> int:
        return bucket(need, span_buckets(capacity, self.min_span)) if self.compiled else min(need, capacity)

    # ------------------------------------------------------------------ clock and cost
    def clock(self) -> float:
        if self.device.type not in ("cpu", "cuda"):
            getattr(torch, self.device.type).synchronize()  # mps, xpu, ...
        return time.perf_counter()

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior(self.device.type)

    def cost_shape(self, m: int) -> float:
        return step_indicator(m)

    def warm_up(self) -> None:
        """One-time set-up before the first step (nothing for eager steps)."""

    def describe(self) -> str:
        how = "eager"
        if self.compiled:
            name = self.compiler if isinstance(self.compiler, str) else type(self.compiler).__name__
            how = f"compiled: {name}" + (f", {self.mode}" if self.mode else "")
        return f"{how} on {self.device}"


class CpuBackend(StepBackend):
    """CPU: the measured linear-kernel plan routes the view's linears; CPU-time clock."""

    def __init__(self, model: torch.nn.Module, compile: str | bool | None = "off", min_span: int = 256) -> None:
        super().__init__(model, torch.device("cpu"), compile, None, min_span)
        self.plan: LinearPlan | None = None
        self.fused = 0  # modules of the view fused by cpu_fused (0: transformers' ops)
        # One torch thread: the forward runs on the calling thread, so its CPU time is
        # the step's cost; with more, the work is spread over a pool and only wall time
        # covers it. Fixed now (the actor sets its thread count first).
        self._timer = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        self._ready = False

    def warm_up(self) -> None:
        """Measure (or read from the disk cache) the kernel plan and route the view; build or
        load the CPU attention kernels (cpu_attention.py: ~0.5 s once per machine), so no
        step's measured cost includes it; once."""
        if self._ready:
            return
        if native.compiler() is None:
            # the one fallback a user can undo, and worth a line: the night runs slower
            log.warning("no C compiler (cc or $CC): the CPU kernels of stages/decoding are not built and "
                        "PyTorch's attention, BLAS and ops run instead, slower; install gcc (or set CC) "
                        "to build them on the next run")
        cpu_attention.library()
        self.plan = plan_for(self.view, self.device, self._timer)
        if self.plan is not None:
            route_linears(self.view, self.plan)
            # Where the plan applies (weights large enough to matter), norms, activations and
            # RoPE run fused too; tiny models keep transformers' ops bit for bit (cpu_fused.py).
            self.fused = fuse_elementwise(self.view)
        self._ready = True

    def clock(self) -> float:
        return self._timer()

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior("cpu", calibrated=self.plan is not None)

    def cost_shape(self, m: int) -> float:
        return self.plan.shape(m) if self.plan is not None else step_indicator(m)

    def describe(self) -> str:
        if self.plan is None:
            plan = "stock kernels (no plan)"
        else:
            plan = f"linear plan {{{self.plan.describe()}}} (packed kernel: {cpu_linear.status()})"
        return (
            f"cpu, {torch.get_num_threads()} thread(s), clock {self._timer.__name__}, {plan}, "
            f"attention {cpu_attention.status()}, "
            f"norms, activations and RoPE {f'fused: {cpu_fused.status()}' if self.fused else 'torch ops'}"
        )


class CudaBackend(StepBackend):
    """CUDA: compiled steps (CUDA graphs) over bucketed shapes by default; synchronised wall clock."""

    def clock(self) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter()


def backend_for(
    model: torch.nn.Module,
    device: torch.device | str | None = None,
    compile: str | bool | None = "auto",
    compile_backend: Callable | None = None,
    min_span: int = 256,
) -> StepBackend:
    """The step backend for ``device`` (default: the model's): CPU, CUDA, or eager elsewhere."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if device.type == "cpu" and compile_backend is None and compile_plan(compile, device)[1] is None:
        return CpuBackend(model, compile, min_span)
    if device.type == "cuda":
        return CudaBackend(model, device, compile, compile_backend, min_span)
    return StepBackend(model, device, compile, compile_backend, min_span)
