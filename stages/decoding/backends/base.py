"""The step backend contract: everything about the device the engine's steps run on.

The engine's loop (engine.py), the generate stage, the KV memory budget (memory.py) and the
slots (slots.py) are the same on every device; they ask a ``StepBackend`` for what differs
and never look at ``device.type`` themselves. One module of this package per backend
(registry.py finds them): torch_eager.py (CPU and any other torch device), cuda.py (CUDA
with captured graphs), cpu_native/ (CPU with the C kernel that paid for itself).

What a backend answers (the contract; tests/stages/decoding/backends/test_contract.py holds
every registered backend to it):
- ``view``: the model the steps run, ``forward.decode_view(model, attention)``: a module tree
  of its own sharing the caller's weights, with the backend's attention function installed
  on the view's config alone (``attention()``: the caller's model and config are never
  touched, and a model the engine does not view keeps transformers' attention).
- step shapes: ``batch(n, slots)`` (rows a step computes for ``n`` active rows),
  ``width(t, max_drafts)`` (tokens per row), ``widths(max_drafts)`` (the widths the width
  rule may choose; None = any), ``span(need, capacity)`` (slots attention reads).
  Exact sizes for eager steps (padding would be computed for nothing), buckets for compiled
  or captured ones (a handful of graphs, replayed): ``ExactShapes`` / ``BucketShapes``.
- ``clock()``: the clock step cost is measured with (seconds; differences only), after
  whatever synchronisation makes queued device work count; ``synchronize()`` alone, and
  ``synchronize_device(device)`` at class level (code that times its own device work,
  e.g. a method's prefill: registry.synchronize(device)).
- ``cost_prior()``/``cost_shape(m)``: what adaptive.StepCost starts from.
- memory: ``free_memory_bytes()`` (what the KV budget is a fraction of, measured now: after
  the weights loaded) and ``kv_memory_fraction`` (the default fraction);
  ``reserves_step_memory`` (the largest step's activations come out of the same pool, so
  the budget leaves them room: memory.step_reserve_bytes).
- slots: ``grows_slots`` (start with a few slots and add them as rows wait, where fresh
  memory is touched when allocated and a relayout is a cheap copy) and
  ``indexed_slot_writes`` (how a step writes its keys/values into the slots: slots.py).
- ``default_chunk_tokens``: the engine's own prefill chunk; ``method_prefill_rows``: rows a
  method's own prefill (Finch, AutoCompressor) takes at once.
- ``make_step(cache)`` (slot_step.SlotStep, compiled or captured as the backend chooses),
  ``warm_up()`` (one-time set-up before the first step), ``describe()`` (one line for logs).
- class level: ``name``, ``summary``, ``priority`` and ``claims(device, compile)`` (the
  registry picks the claiming backend of highest priority), ``prepare_process(device, num_cpus)``
  (process settings before the model loads), ``device_name(device)``.
- the device, for code outside an engine (model loading, training, benchmarks; reached
  through registry.py's helpers, so no caller looks at ``device.type``): ``device_type``
  and ``device_count()`` (the accelerator this backend runs on and how many this machine
  has; None/0 for the host; a device torch's ``torch.accelerator`` counts: where it
  counts none, registry.py asks no backend), ``auto_dtype(device, small_model)`` and
  ``auto_dtype_by_size`` (generation.dtype auto), ``autocast(device)`` (training's mixed
  precision), ``hardware_name(device)``, ``empty_cache``, ``reset_peak_memory``,
  ``memory_allocated_bytes`` and ``peak_memory_bytes`` (None: not measured on this device),
  ``is_available(device)`` (this machine has the device), ``runs_on_host(device)`` (the
  host's CPU does the work: torch threads, process CPU time and DRAM bandwidth are what
  count), ``time_device_work(device, fn)`` (seconds of the device work ``fn`` queues: CUDA
  events on CUDA, a synchronised wall clock elsewhere), ``bandwidth_probe_bytes`` (the copy
  that measures memory bandwidth), ``nominal_bandwidth(name)`` (the data-sheet bytes/s of a
  device named so; None: no data sheet, e.g. the host), ``rng_state()`` and
  ``set_rng_state(state)`` (the device's own generators, all of its devices: what a
  training checkpoint saves beside torch's CPU generator; None on the host).
Nothing here is process-global: an engine owns its backend, and a backend what it measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import ClassVar

import torch

from stages.decoding.adaptive import default_cost_prior, step_indicator
from stages.decoding.forward import decode_view, packed_gqa_sdpa
from stages.decoding.memory import available_ram_bytes
from stages.decoding.slot_step import (
    SlotStep,
    batch_buckets,
    bucket,
    span_buckets,
    width_buckets,
)
from stages.decoding.slots import SlotCache

COMPILE_CHOICES = ("auto", "inductor", "cudagraphs", "off")

#: An attention function in transformers' AttentionInterface form (forward.packed_gqa_sdpa).
Attention = Callable[..., tuple[torch.Tensor, None]]


def compile_choice(compile: str | bool | None) -> str:
    """``generation.compile`` as one of COMPILE_CHOICES (True = inductor, False = off, None = auto)."""
    choice = {True: "inductor", False: "off", None: "auto"}.get(compile, compile)  # type: ignore[arg-type]
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile {compile!r}: allowed: {', '.join(COMPILE_CHOICES)}")
    return choice


@dataclass(frozen=True)
class ExactShapes:
    """Eager steps: every shape exact (eager kernels take any shape; padding is paid for)."""

    def batch(self, n: int, slots: int) -> int:
        return n

    def width(self, t: int, max_drafts: int) -> int:
        return t

    def widths(self, max_drafts: int) -> tuple[int, ...] | None:
        return None

    def span(self, need: int, capacity: int) -> int:
        return min(need, capacity)


@dataclass(frozen=True)
class BucketShapes:
    """Compiled or captured steps: shapes rounded up to buckets (slot_step.py), so a handful
    of graphs is reused. ``min_span``: the smallest attention span bucket."""

    min_span: int = 256

    def batch(self, n: int, slots: int) -> int:
        return bucket(n, batch_buckets(slots))

    def width(self, t: int, max_drafts: int) -> int:
        return bucket(t, width_buckets(max_drafts))

    def widths(self, max_drafts: int) -> tuple[int, ...] | None:
        return width_buckets(max_drafts)

    def span(self, need: int, capacity: int) -> int:
        return bucket(need, span_buckets(capacity, self.min_span))


class StepBackend:
    """The contract with eager defaults (see the module docstring); subclasses override."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    priority: ClassVar[int] = 0  # the registry tries higher first
    kv_memory_fraction: ClassVar[float] = 0.25
    reserves_step_memory: ClassVar[bool] = False
    grows_slots: ClassVar[bool] = False
    indexed_slot_writes: ClassVar[bool] = False
    default_chunk_tokens: ClassVar[int] = 2048
    method_prefill_rows: ClassVar[int] = 1

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device | str,
        compile: str | bool | None = "off",
        compile_backend: Callable | None = None,
        min_span: int = 256,
    ) -> None:
        self.device = torch.device(device)
        self.mode, self.compiler = self.compile_plan(compile_choice(compile))
        if compile_backend is not None:
            self.compiler = compile_backend
        self.min_span = min_span
        self.shapes: ExactShapes | BucketShapes = BucketShapes(min_span) if self.compiled else ExactShapes()
        self.view = decode_view(model, self.attention(model))

    # ------------------------------------------------------------------ choosing one
    @classmethod
    def claims(cls, device: torch.device, compile: str) -> bool:
        """Whether this backend runs steps on ``device`` with compile choice ``compile``."""
        return False

    @classmethod
    def compile_plan(cls, choice: str) -> tuple[str | None, str | None]:
        """(torch.compile mode, compiler) for a compile choice; compiler None = eager.
        Off CUDA: ``auto`` is eager (inductor was measured slower on CPU: see cuda.py's
        ``compile_plan`` for the figures), ``cudagraphs`` is refused."""
        if choice == "cudagraphs":
            raise ValueError(f"compile cudagraphs needs a CUDA device ({cls.name} backend); allowed here: inductor, off")
        return (None, "inductor") if choice == "inductor" else (None, None)

    @classmethod
    def prepare_process(cls, device: torch.device, num_cpus: float | None) -> str | None:
        """Process settings before the model loads (the generate actor calls it once), for
        ``num_cpus`` CPUs (None: not fixed, the process's own default); returns a line for
        the log, or None."""
        return None

    @classmethod
    def device_name(cls, device: torch.device) -> str:
        """The device as results name it."""
        return str(device)

    # ------------------------------------------------------------------ the view
    def attention(self, model: torch.nn.Module) -> Attention:
        """The attention function installed on the view (forward.decode_view)."""
        return packed_gqa_sdpa

    @property
    def compiled(self) -> bool:
        return self.compiler is not None

    def make_step(self, cache: SlotCache) -> SlotStep:
        """The step over ``cache`` (compiled when this backend compiles)."""
        return SlotStep(self.view, cache, self.compiled, self.mode, self.compiler or "inductor", self.min_span)

    def warm_up(self) -> None:
        """One-time set-up before the first step (nothing for eager steps)."""

    # ------------------------------------------------------------------ shapes
    def batch(self, n: int, slots: int) -> int:
        return self.shapes.batch(n, slots)

    def width(self, t: int, max_drafts: int) -> int:
        return self.shapes.width(t, max_drafts)

    def widths(self, max_drafts: int) -> tuple[int, ...] | None:
        return self.shapes.widths(max_drafts)

    def span(self, need: int, capacity: int) -> int:
        return self.shapes.span(need, capacity)

    # ------------------------------------------------------------------ clock, cost, memory
    @classmethod
    def synchronize_device(cls, device: torch.device) -> None:
        """Wait for ``device``'s queued work (nothing where work runs as it is called); for
        code that times device work without a backend of its own (registry.synchronize)."""

    def synchronize(self) -> None:
        """Wait for the device's queued work (``synchronize_device`` of this backend's device)."""
        self.synchronize_device(self.device)

    def clock(self) -> float:
        self.synchronize()
        return time.perf_counter()

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior(accelerator=True)

    def cost_shape(self, m: int) -> float:
        return step_indicator(m)

    def free_memory_bytes(self) -> int:
        """Memory the KV budget is a fraction of, now: the host's available RAM by default."""
        return available_ram_bytes()

    # ------------------------------------------------------------------ the device, outside an engine
    #: The accelerator's torch device type this backend runs on; None: the host (CPU).
    device_type: ClassVar[str | None] = None
    #: generation.dtype auto depends on the model's size here (``auto_dtype``'s small_model).
    auto_dtype_by_size: ClassVar[bool] = False

    @classmethod
    def device_count(cls) -> int:
        """Devices of ``device_type`` this machine has (0: none, or the host)."""
        return 0

    @classmethod
    def auto_dtype(cls, device: torch.device, small_model: bool) -> torch.dtype:
        """generation.dtype ``auto`` on ``device``: float32 on the host (no fast half
        precision there). ``small_model``: the model is under model_size.SMALL_MODEL_PARAMS."""
        return torch.float32

    @classmethod
    def autocast(cls, device: torch.device) -> AbstractContextManager:
        """Training's mixed precision on ``device``: none by default."""
        return contextlib.nullcontext()

    @classmethod
    def hardware_name(cls, device: torch.device) -> str | None:
        """The device's own name (a GPU model); None: the host, which the caller names."""
        return None

    @classmethod
    def empty_cache(cls, device: torch.device) -> None:
        """Hand cached free memory back to the device (nothing where no allocator caches)."""

    @classmethod
    def reset_peak_memory(cls, device: torch.device) -> None:
        """Start ``peak_memory_bytes`` over from now (nothing where it is not measured)."""

    @classmethod
    def memory_allocated_bytes(cls, device: torch.device) -> int | None:
        """Bytes of tensors allocated on ``device`` now; None: not measured here."""
        return None

    @classmethod
    def peak_memory_bytes(cls, device: torch.device) -> int | None:
        """Most bytes allocated on ``device`` since ``reset_peak_memory``; None: not measured here."""
        return None

    @classmethod
    def is_available(cls, device: torch.device) -> bool:
        """Whether this machine has ``device``: the host always; an accelerator when
        ``device_count()`` finds one (devices without a backend of their own: torch says)."""
        return cls.device_type is None or cls.device_count() > 0

    @classmethod
    def runs_on_host(cls, device: torch.device) -> bool:
        """Whether the host's CPU does ``device``'s work (torch's threads, this process's CPU
        time and DRAM bandwidth are then what a measurement is about)."""
        return device.type == "cpu"

    #: Bytes of the copy that measures ``device``'s memory bandwidth (benchmarks' roofline):
    #: 256 MiB, well past the host's caches.
    bandwidth_probe_bytes: ClassVar[int] = 2**28

    @classmethod
    def time_device_work(cls, device: torch.device, fn: Callable[[], object]) -> float:
        """Seconds the work ``fn()`` does on ``device``: wall time between synchronisations
        (nothing to wait for on the host)."""
        cls.synchronize_device(device)
        t = time.perf_counter()
        fn()
        cls.synchronize_device(device)
        return time.perf_counter() - t

    @classmethod
    def nominal_bandwidth(cls, name: str) -> float | None:
        """Data-sheet memory bandwidth (bytes/s) of the device called ``name``
        (``hardware_name``); None: unknown, or no data sheet (the host)."""
        return None

    @classmethod
    def rng_state(cls) -> object | None:
        """The random state of every device of ``device_type`` (None: the host, whose
        generator is torch's own: torch.get_rng_state)."""
        return None

    @classmethod
    def set_rng_state(cls, state: object) -> None:
        """Restore what ``rng_state`` returned (nothing on the host)."""

    def describe(self) -> str:
        how = "eager"
        if self.compiled:
            name = self.compiler if isinstance(self.compiler, str) else type(self.compiler).__name__
            how = f"compiled: {name}" + (f", {self.mode}" if self.mode else "")
        return f"{self.name} backend, {how} on {self.device}"
