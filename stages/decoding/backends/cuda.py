"""The CUDA backend: the eager step captured as CUDA graphs (cuda_graphs.py) over bucketed shapes.

Buckets (base.BucketShapes) keep the graphs to a handful of shapes, captured at warm-up and
replayed. The clock is wall time after a synchronise; the KV budget is a fraction of the
device memory free after the weights loaded, less the largest step's activations
(``reserves_step_memory``); a prefill chunk is 4,096 tokens and a method's own prefill
takes 4 rows at once (the GPU's work per call grows with rows until it saturates).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from stages.decoding.backends.base import StepBackend
from stages.decoding.backends.cuda_graphs import CapturedSteps
from stages.decoding.slot_step import SlotStep
from stages.decoding.slots import SlotCache

# Data-sheet HBM bandwidth, GB/s (10^9 bytes), by a substring of torch's device name
# (CudaBackend.nominal_bandwidth). Order matters: the first match wins, so the specific
# names come first.
NOMINAL_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM (HBM3)
    ("GH200", 4000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("T4", 320.0),
)


class CudaBackend(StepBackend):
    """CUDA: captured (or compiled) steps over bucketed shapes by default; synchronised wall clock."""

    name = "cuda"
    summary = "CUDA: the eager step captured as CUDA graphs over bucketed shapes (compile: auto)"
    priority = 10
    kv_memory_fraction = 0.85
    reserves_step_memory = True
    default_chunk_tokens = 4096
    method_prefill_rows = 4

    @classmethod
    def claims(cls, device: torch.device, compile: str) -> bool:
        return device.type == "cuda"

    @classmethod
    def compile_plan(cls, choice: str) -> tuple[str | None, str | None]:
        """``auto`` is ``cudagraphs`` (the eager step captured by hand, cuda_graphs.py): it
        replays the eager step bit for bit and warms up in seconds, where inductor compiles
        for minutes, for a step about as fast at batch 1, and several times faster than eager.
        ``compile: inductor`` stays a choice (with torch's CUDA graphs: mode reduce-overhead);
        a night with it is unmeasured.

        Off CUDA ``auto`` is eager because inductor was measured slower there, with a first
        warm-up of minutes (both measured: jobs/results/code-choices.md,
        "stages/decoding/backends/cuda.py").
        """
        if choice in ("auto", "cudagraphs"):
            return None, "cudagraphs"
        if choice == "inductor":
            return "reduce-overhead", "inductor"
        return None, None

    def make_step(self, cache: SlotCache) -> SlotStep:
        """Captured graphs (``cudagraphs``: the eager step, CapturedSteps), inductor (its CUDA
        graph trees record a shape on the third call), or eager."""
        if self.compiler == "cudagraphs":
            return SlotStep(self.view, cache, True, None, "cudagraphs", self.min_span, capture=CapturedSteps)
        return SlotStep(self.view, cache, self.compiled, self.mode, self.compiler or "inductor", self.min_span,
                        warm_up_calls=3 if self.compiled else 1)

    @classmethod
    def device_name(cls, device: torch.device) -> str:
        return f"cuda:{cls.hardware_name(device)}"

    @classmethod
    def synchronize_device(cls, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def clock(self) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def free_memory_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.device)
        return int(free)

    # ------------------------------------------------------------------ the device, outside an engine
    device_type = "cuda"
    auto_dtype_by_size = True

    @classmethod
    def device_count(cls) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    @classmethod
    def auto_dtype(cls, device: torch.device, small_model: bool) -> torch.dtype:
        """bfloat16, except float32 for a small model (model_size.SMALL_MODEL_PARAMS says
        what was measured)."""
        return torch.float32 if small_model else torch.bfloat16

    @classmethod
    def autocast(cls, device: torch.device) -> AbstractContextManager:
        return torch.autocast("cuda", dtype=torch.bfloat16)

    @classmethod
    def hardware_name(cls, device: torch.device) -> str | None:
        return torch.cuda.get_device_name(device)

    @classmethod
    def empty_cache(cls, device: torch.device) -> None:
        torch.cuda.empty_cache()

    @classmethod
    def reset_peak_memory(cls, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    @classmethod
    def memory_allocated_bytes(cls, device: torch.device) -> int | None:
        return torch.cuda.memory_allocated(device)

    @classmethod
    def peak_memory_bytes(cls, device: torch.device) -> int | None:
        return torch.cuda.max_memory_allocated(device)

    @classmethod
    def runs_on_host(cls, device: torch.device) -> bool:
        return False

    #: 1 GiB: a device-to-device copy long enough to reach the HBM's rate.
    bandwidth_probe_bytes = 2**30

    @classmethod
    def time_device_work(cls, device: torch.device, fn: Callable[[], object]) -> float:
        """CUDA events around ``fn()`` on the current stream: the GPU's own time for the work."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    @classmethod
    def nominal_bandwidth(cls, name: str) -> float | None:
        """NOMINAL_GBPS's figure for the first substring of ``name`` it lists."""
        for key, gbps in NOMINAL_GBPS:
            if key.lower() in name.lower():
                return gbps * 1e9
        return None

    @classmethod
    def rng_state(cls) -> object | None:
        return torch.cuda.get_rng_state_all()

    @classmethod
    def set_rng_state(cls, state: object) -> None:
        torch.cuda.set_rng_state_all(state)
