"""Step backends: how the engine's steps run on one device (the contract: base.py).

Modules: base.py (the contract, exact and bucketed step shapes), registry.py (finds the
backends and picks one: ``backend_for``), torch_eager.py (PyTorch's kernels: CPU and any
other torch device), cuda.py (+ cuda_graphs.py: CUDA graphs of the eager step),
cpu_native/ (CPU with the causal prefill kernel, where it pays).
"""

from stages.decoding.backends.base import COMPILE_CHOICES, StepBackend
from stages.decoding.backends.registry import (
    accelerator,
    accelerator_backend,
    accelerator_count,
    backend_class,
    backend_for,
    compile_plan,
    device_backend,
    registry,
    synchronize,
)

__all__ = ["COMPILE_CHOICES", "StepBackend", "accelerator", "accelerator_backend", "accelerator_count",
           "backend_class", "backend_for", "compile_plan", "device_backend", "registry", "synchronize"]
