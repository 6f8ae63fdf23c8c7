"""Step backends: how the engine's steps run on one device (the contract: base.py).

Modules: base.py (the contract, exact and bucketed step shapes), registry.py (finds the
backends and picks one: ``backend_for``), torch_eager.py (PyTorch's kernels: CPU and any
other torch device), cuda.py (+ cuda_graphs.py: CUDA graphs of the eager step),
cpu_native/ (CPU with the causal prefill kernel, where it pays).
"""

from typing import TYPE_CHECKING, Any

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
    torch_sees_accelerator,
)

if TYPE_CHECKING:
    from stages.decoding.backends.base import COMPILE_CHOICES, StepBackend


def __getattr__(name: str) -> Any:
    """base.py's names on first use: it imports the model stack (transformers, seconds), which
    counting this machine's accelerators (``accelerator_count``) must not wait for."""
    if name in ("COMPILE_CHOICES", "StepBackend"):
        from stages.decoding.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMPILE_CHOICES", "StepBackend", "accelerator", "accelerator_backend", "accelerator_count",
           "backend_class", "backend_for", "compile_plan", "device_backend", "registry", "synchronize",
           "torch_sees_accelerator"]
