"""The step backend contract (stages/decoding/backends/base.py), held against every registered backend.

Each backend runs on the device it claims where this machine has one (CUDA's GPU parts skip
cleanly without a GPU); the CPU-native backend runs its kernel's portable path, so it is
tested on every CPU. What needs no device (CUDA's compile plan, shapes and buckets) is tested
everywhere. Adding a backend is adding its module: ``_make`` puts it on the device it
declares (``device_type``), so this file needs no edit for it.
"""

from __future__ import annotations

import importlib
import time

import pytest
import torch

from stages.decoding.backends import StepBackend, backend_class, backend_for, compile_plan, registry
from stages.decoding.backends.base import BucketShapes, ExactShapes
from stages.decoding.backends.cpu_native import (
    CpuNativeBackend,
    native_attention,
    portable_native_attention,
)
from stages.decoding.backends.cpu_native import attention as kernel
from stages.decoding.backends.cuda import CudaBackend
from stages.decoding.backends.torch_eager import TorchEagerBackend, host_attention
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.forward import attention_name
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts

NO_EOS = frozenset({-1})


def _make(name: str, model: torch.nn.Module) -> StepBackend:
    """The backend ``name`` on the device it claims, or a clean skip where this machine has none.

    Read from the backend's own declaration (``device_type``), not its name: an accelerator's
    backend runs on its device with ``compile: auto`` (its graphs, where it captures them),
    a host backend on the CPU eagerly; a new backend module is tested here with no edit."""
    cls = registry()[name]
    if name == "cpu-native":
        return CpuNativeBackend(model, "cpu", portable=True)  # the kernel's portable path: any CPU
    if cls.device_type is not None:
        if cls.device_count() == 0:
            pytest.skip(f"the {name} backend's device parts need a {cls.device_type} device "
                        "(what needs none, e.g. its shapes, is tested below)")
        return cls(model.to(cls.device_type), cls.device_type, "auto")
    return cls(model, "cpu", "off")


@pytest.fixture
def fresh_model(tiny_llama_factory):
    return tiny_llama_factory(512, seed=1)


def _fingerprint(model: torch.nn.Module) -> list:
    """Everything a backend could change on a model, per module."""
    return [
        (name, type(m), id(m), "forward" in m.__dict__, tuple(id(p) for p in m.parameters(recurse=False)))
        for name, m in model.named_modules()
    ] + [model.config._attn_implementation]


@pytest.mark.parametrize("name", list(registry()))
def test_every_backend_keeps_the_contract(name, fresh_model):
    model = fresh_model
    before = _fingerprint(model)
    backend = _make(name, model)
    cls = type(backend)
    # registered: a name, a summary, found by the registry; claims its own device
    assert cls.name == name and cls.summary and registry()[name] is cls
    assert cls.claims(backend.device, "off") or name == "cpu-native"  # native claims only with its fast path
    # the view: shares every weight, installs the backend's attention on itself alone
    assert _fingerprint(model) == before
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert {n: p.data_ptr() for n, p in backend.view.named_parameters()} == ptrs
    assert backend.view.config._attn_implementation == attention_name(backend.attention(model))
    # shapes: never smaller than asked, within the slots / capacity
    for n, slots in ((1, 1), (3, 8), (8, 8)):
        assert n <= backend.batch(n, slots) <= max(slots, n)
    assert backend.width(3, 8) >= 3 and backend.span(100, 1024) >= 100 and backend.span(5000, 1024) == 1024
    widths = backend.widths(8)
    assert widths is None or (1 in widths and max(widths) >= 9)
    # clock: seconds, monotone; synchronize returns
    backend.synchronize()
    t0 = backend.clock()
    sum(range(10000))
    assert backend.clock() >= t0
    # cost prior, memory, slots, prefill: the figures the engine asks for
    c, j = backend.cost_prior()
    assert c >= 0 and j >= 0 and backend.cost_shape(1) == 0 and backend.cost_shape(4) >= 0
    assert backend.free_memory_bytes() > 0 and 0 < cls.kv_memory_fraction <= 1
    assert backend.default_chunk_tokens >= 256 and backend.method_prefill_rows >= 1
    assert isinstance(backend.grows_slots, bool) and isinstance(backend.indexed_slot_writes, bool)
    assert isinstance(backend.describe(), str) and name in backend.describe()
    assert isinstance(cls.device_name(backend.device), str)
    _device_answers(cls, backend.device)


def _device_answers(cls: type[StepBackend], device: torch.device) -> None:
    """The class-level device answers code outside an engine asks (benchmarks, training's
    checkpoints), on a device the backend claims and this machine has."""
    assert cls.is_available(device)
    # the host: no accelerator type of its own; an accelerator: not the host
    assert cls.runs_on_host(device) == (cls.device_type is None)
    # timing device work: the work done, seconds >= 0
    src = torch.arange(4096, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    seconds = cls.time_device_work(device, lambda: dst.copy_(src))
    assert isinstance(seconds, float) and seconds >= 0 and torch.equal(dst, src)
    assert cls.bandwidth_probe_bytes >= 2**20 and cls.bandwidth_probe_bytes % 4 == 0
    nominal = cls.nominal_bandwidth(cls.hardware_name(device) or "host")
    assert nominal is None or nominal > 0
    cls.empty_cache(device)
    # the device's generators: None on the host (torch's own generator); else a round trip
    state = cls.rng_state()
    if state is None:
        assert cls.device_type is None
        cls.set_rng_state(state)
    else:
        first = torch.rand(8, device=device)
        cls.set_rng_state(state)
        assert torch.equal(torch.rand(8, device=device), first)


@pytest.mark.parametrize("name", list(registry()))
def test_greedy_decoding_through_every_backend_equals_the_reference(name, fresh_model, monkeypatch):
    """The engine over the backend: the same tokens as plain greedy decoding (reference.py),
    with drafts verified (so wide steps and the prefill attention run too)."""
    ran = []
    attend = kernel.attend_causal

    def counted(*args, **kwargs):
        out = attend(*args, **kwargs)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(kernel, "attend_causal", counted)
    backend = _make(name, fresh_model)
    device = backend.device
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 37, 19)]
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS)
    want = [r.tokens for r in decode_plain(fresh_model, prefill_full(fresh_model, prompts, 0), cfg)]
    spec = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, speculative="prompt_lookup", num_draft_tokens=4,
                        max_ngram=3, adaptive=False)
    engine = Engine(fresh_model, spec, slots=3, expected_tokens=64, backend=backend, chunk_tokens=16)
    reqs = [Request(i, PromptParts([], p, []), p + w) for i, (p, w) in enumerate(zip(prompts, want, strict=True))]
    got = [f.result.tokens for f in engine.run(reqs)]
    assert got == want, f"{name} on {device}"
    assert (name == "cpu-native") == any(ran)  # the native backend's prefill chunks went through its kernel


# ---------------------------------------------------------------------------- choosing a backend
def test_the_registry_finds_each_backend_by_its_module_and_orders_them_by_priority():
    names = list(registry())
    assert set(names) >= {"cuda", "cpu-native", "torch"}
    priorities = [registry()[n].priority for n in names]
    assert priorities == sorted(priorities, reverse=True)


def test_the_backend_for_a_device(tiny_model, monkeypatch):
    native = kernel.library() is not None  # a C compiler and an AVX-512 CPU
    assert backend_class("cpu") is (CpuNativeBackend if native else TorchEagerBackend)
    assert backend_class("cpu", "inductor") is TorchEagerBackend  # compiled steps: torch's kernels
    assert backend_class("cuda") is CudaBackend
    assert backend_class("meta") is TorchEagerBackend  # any other torch device: eager
    assert type(backend_for(tiny_model, "cpu", compile="off")) is backend_class("cpu")
    monkeypatch.setenv("LONGDOC_STEP_BACKEND", "torch")  # e.g. to measure the native backend against it
    assert backend_class("cpu") is TorchEagerBackend
    monkeypatch.setenv("LONGDOC_STEP_BACKEND", "cuda")
    with pytest.raises(ValueError, match="does not run on cpu"):
        backend_class("cpu")
    monkeypatch.setenv("LONGDOC_STEP_BACKEND", "tpu")
    with pytest.raises(ValueError, match="allowed: "):
        backend_class("cpu")


def test_compile_choices_per_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_plan("auto", cpu) == (None, None) and compile_plan(None, cpu) == (None, None)
    assert compile_plan(True, cpu) == (None, "inductor")
    assert compile_plan("auto", cuda) == (None, "cudagraphs") and compile_plan("cudagraphs", cuda) == (None, "cudagraphs")
    assert compile_plan("inductor", cuda) == ("reduce-overhead", "inductor")
    assert compile_plan("off", cuda) == (None, None)
    with pytest.raises(ValueError, match="cudagraphs needs a CUDA device"):
        compile_plan("cudagraphs", cpu)
    with pytest.raises(ValueError, match="allowed: auto, inductor, cudagraphs, off"):
        compile_plan("fast", cpu)


# ---------------------------------------------------------------------------- shapes, on any machine
def test_shapes_exact_when_eager_bucketed_when_compiled_or_captured(tiny_model):
    exact, buckets = ExactShapes(), BucketShapes(min_span=256)
    assert (exact.batch(3, 8), exact.width(5, 16), exact.span(300, 1024), exact.widths(16)) == (3, 5, 300, None)
    assert buckets.batch(3, 8) == 4 and buckets.width(5, 16) == 8 and buckets.span(300, 1024) == 512
    assert buckets.widths(16) == (1, 4, 8, 17)
    eager = TorchEagerBackend(tiny_model, "cpu", "off")
    compiled = TorchEagerBackend(tiny_model, "cpu", "inductor")
    assert isinstance(eager.shapes, ExactShapes) and isinstance(compiled.shapes, BucketShapes)
    # CUDA's captured steps take buckets: its plan for auto is a compiled one
    assert CudaBackend.compile_plan("auto")[1] == "cudagraphs"


def test_cuda_declares_its_memory_and_prefill_figures():
    """No GPU needed: what the engine reads off the class."""
    assert CudaBackend.reserves_step_memory and CudaBackend.kv_memory_fraction == 0.85
    assert CudaBackend.default_chunk_tokens == 4096 and CudaBackend.method_prefill_rows == 4
    assert not CudaBackend.grows_slots and not CudaBackend.indexed_slot_writes
    assert CudaBackend.clock is not StepBackend.clock  # synchronises before reading the time


def test_cpu_backends_grow_slots_write_by_index_and_time_this_threads_cpu(tiny_model):
    for backend in (TorchEagerBackend(tiny_model, "cpu"), CpuNativeBackend(tiny_model, portable=True)):
        assert backend.grows_slots and backend.indexed_slot_writes
        assert backend._timer is (time.thread_time if torch.get_num_threads() == 1 else time.perf_counter)
        assert backend.cost_prior() == (0.06, 0.7)


def test_the_native_kernel_goes_only_to_the_families_it_was_measured_with(tiny_model, tiny_llama_factory):
    """Recognised by the declared structure (config.model_type), not by code inspection."""
    llama = CpuNativeBackend(tiny_model, portable=True)
    assert llama.attention(tiny_model) is portable_native_attention
    assert CpuNativeBackend(tiny_model).attention(tiny_model) is native_attention
    other = tiny_llama_factory(64)
    other.config.model_type = "gemma2"  # declared: soft-capping and sliding windows the kernel lacks
    assert CpuNativeBackend(other, portable=True).attention(other) is host_attention
    with pytest.raises(ValueError, match="eager steps on the CPU"):
        CpuNativeBackend(tiny_model, compile="inductor")


def test_code_outside_an_engine_synchronises_through_the_registry():
    """registry.synchronize(device): what a method's prefill calls to time its device work."""
    from stages.decoding.backends import synchronize

    synchronize("cpu")  # nothing queued on the host: returns
    synchronize(torch.device("cpu"))
    if torch.cuda.is_available():
        synchronize("cuda")


def test_device_questions_outside_an_engine_are_answered_by_the_devices_backend():
    """registry.device_backend and the class-level device answers that model loading,
    training and the benchmarks ask instead of looking at ``device.type`` (no GPU needed:
    the host's answers, and what CUDA declares off its class)."""
    from stages.decoding.backends import (
        accelerator,
        accelerator_backend,
        accelerator_count,
        device_backend,
    )

    cpu = torch.device("cpu")
    host = device_backend(cpu)
    assert host.device_type is None and host.device_count() == 0 and not host.auto_dtype_by_size
    assert host.auto_dtype(cpu, small_model=False) is torch.float32
    assert host.hardware_name(cpu) is None  # the caller names the host (roofline: /proc/cpuinfo)
    assert host.memory_allocated_bytes(cpu) is None and host.peak_memory_bytes(cpu) is None
    host.empty_cache(cpu)
    host.reset_peak_memory(cpu)
    assert host.is_available(cpu) and host.runs_on_host(cpu)
    assert host.nominal_bandwidth("NVIDIA H100 80GB HBM3") is None  # no data sheet for the host
    assert host.rng_state() is None and host.bandwidth_probe_bytes == 2**28
    assert host.time_device_work(cpu, lambda: sum(range(1000))) >= 0
    with host.autocast(cpu):  # no mixed precision on the host
        assert not torch.is_autocast_enabled()
    # CUDA: bf16 except small models (the dtype reads the model's size), bf16 autocast.
    assert CudaBackend.device_type == "cuda" and CudaBackend.auto_dtype_by_size
    assert CudaBackend.auto_dtype(torch.device("cuda"), small_model=False) is torch.bfloat16
    assert CudaBackend.auto_dtype(torch.device("cuda"), small_model=True) is torch.float32
    assert device_backend("cuda") is CudaBackend
    cuda = torch.device("cuda")
    assert not CudaBackend.runs_on_host(cuda) and CudaBackend.bandwidth_probe_bytes == 2**30
    assert CudaBackend.is_available(cuda) == torch.cuda.is_available()
    # This machine's accelerator: CUDA's devices, or none (then a GPU request runs on the host).
    if torch.cuda.is_available():
        assert accelerator() == torch.device("cuda") and accelerator_count() == torch.cuda.device_count()
        with CudaBackend.autocast(torch.device("cuda")):
            assert torch.is_autocast_enabled("cuda")
    else:
        assert accelerator() is None and accelerator_count() == 0
        assert accelerator_backend() is None


def test_accelerator_found_past_the_step_backend_switch(monkeypatch):
    """$LONGDOC_STEP_BACKEND picks step backends; the accelerator's own answers (its count,
    its generators) still come from its backend."""
    from stages.decoding.backends import accelerator, accelerator_backend, accelerator_count

    found = importlib.import_module("stages.decoding.backends.registry")  # the module (the package's name is its function)

    monkeypatch.setattr(CudaBackend, "device_count", classmethod(lambda cls: 2))
    monkeypatch.setattr(found, "torch_sees_accelerator", lambda: True)  # torch's count, as CUDA's stand-in
    monkeypatch.setenv("LONGDOC_STEP_BACKEND", "torch")
    assert accelerator_backend() is CudaBackend and accelerator() == torch.device("cuda")
    assert accelerator_count() == 2


def test_cuda_device_answers_without_a_gpu(monkeypatch):
    """What CUDA answers with torch.cuda, checked against stand-ins (no GPU needed)."""
    cuda = torch.device("cuda")
    # timing: CUDA events around the work, their elapsed milliseconds in seconds
    log = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.name = "start" if not any(e == "new" for e in log) else "end"
            log.append("new")

        def record(self) -> None:
            log.append(f"record {self.name}")

        def synchronize(self) -> None:
            log.append(f"synchronize {self.name}")

        def elapsed_time(self, end: Event) -> float:
            return 250.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert CudaBackend.time_device_work(cuda, lambda: log.append("work")) == 0.25
    assert log == ["new", "new", "record start", "work", "record end", "synchronize end"]
    # the generators of every CUDA device, saved and restored whole
    restored = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu0", "gpu1"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    assert CudaBackend.rng_state() == ["gpu0", "gpu1"]
    CudaBackend.set_rng_state(["gpu0", "gpu1"])
    assert restored == [["gpu0", "gpu1"]]
    # the data sheet, by torch's device name: the specific names first
    assert CudaBackend.nominal_bandwidth("NVIDIA H200") == 4800e9
    assert CudaBackend.nominal_bandwidth("NVIDIA H100 PCIe") == 2000e9
    assert CudaBackend.nominal_bandwidth("NVIDIA H100 80GB HBM3") == 3350e9
    assert CudaBackend.nominal_bandwidth("Some New GPU") is None
    # availability: what torch sees
    monkeypatch.setattr(CudaBackend, "device_count", classmethod(lambda cls: 0))
    assert not CudaBackend.is_available(cuda)
    monkeypatch.setattr(CudaBackend, "device_count", classmethod(lambda cls: 1))
    assert CudaBackend.is_available(cuda)
