"""Step backends, one module (or package) each, found by scanning backends/: the device seam.

Contract: every module of this package except ``base``, ``registry`` and ``cuda_graphs``
(a helper of cuda.py) defines exactly one ``StepBackend`` subclass (base.py) declaring
``name`` and ``summary``. ``registry()`` returns name -> class, highest ``priority``
first; ``backend_for(model, device, compile, ...)`` makes the first whose ``claims(device,
compile)`` holds, or the one ``$LONGDOC_STEP_BACKEND`` names (e.g. ``torch``, to measure a
native backend against PyTorch's kernels; refused when that backend does not claim the
device). ``backend_class(device, compile)`` is the class alone (process set-up before the
model loads). Adding a device is adding one module and its contract test
(tests/stages/decoding/backends/test_contract.py runs against every registered backend).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # base.py imports the model stack (transformers): only once a backend is needed
    from stages.decoding.backends.base import StepBackend

_NOT_BACKENDS = ("base", "registry", "cuda_graphs")
SWITCH = "LONGDOC_STEP_BACKEND"


@functools.lru_cache(maxsize=1)
def registry() -> Mapping[str, type[StepBackend]]:
    """name -> StepBackend class, every module of backends/ scanned, highest priority first."""
    from stages.decoding.backends.base import StepBackend

    found: dict[str, type[StepBackend]] = {}
    package = __name__.rpartition(".")[0]  # by path, not by importing the package (no circle)
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name in _NOT_BACKENDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        classes = [
            obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, StepBackend) and obj.__module__ == module.__name__
        ]
        if len(classes) != 1:
            raise TypeError(f"{module.__name__} must define exactly one StepBackend, found {len(classes)}")
        cls = classes[0]
        for attr in ("name", "summary"):
            if not getattr(cls, attr, None):
                raise TypeError(f"{module.__name__}: {cls.__name__} does not declare {attr!r}")
        if cls.name in found:
            raise TypeError(f"step backend name {cls.name!r} is taken")
        found[cls.name] = cls
    ordered = sorted(found.items(), key=lambda kv: (-kv[1].priority, kv[0]))
    return MappingProxyType(dict(ordered))


def backend_class(device: torch.device | str, compile: str | bool | None = "auto") -> type[StepBackend]:
    """The class that runs steps on ``device`` (see the module contract)."""
    from stages.decoding.backends.base import compile_choice

    device, choice = torch.device(device), compile_choice(compile)
    forced = os.environ.get(SWITCH)
    if forced:
        cls = registry().get(forced)
        if cls is None:
            raise ValueError(f"${SWITCH}={forced!r}: allowed: {', '.join(registry())}")
        if not cls.claims(device, choice):
            raise ValueError(f"${SWITCH}={forced!r} does not run on {device} with compile {choice} here")
        return cls
    for cls in registry().values():
        if cls.claims(device, choice):
            return cls
    raise ValueError(f"no step backend runs on {device} (registered: {', '.join(registry())})")


def backend_for(
    model: torch.nn.Module,
    device: torch.device | str | None = None,
    compile: str | bool | None = "auto",
    compile_backend: Callable | None = None,
    min_span: int = 256,
) -> StepBackend:
    """The step backend for ``device`` (default: the model's); a ``compile_backend`` (tests: a
    counting torch.compile backend) is a compiled step, so the native backend does not claim it."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    cls = backend_class(device, "inductor" if compile_backend is not None else compile)
    return cls(model, device, compile, compile_backend, min_span)


def compile_plan(compile: str | bool | None, device: torch.device | str) -> tuple[str | None, str | None]:
    """(torch.compile mode, compiler) the backend for ``device`` runs a compile choice with."""
    from stages.decoding.backends.base import compile_choice

    return backend_class(device, compile).compile_plan(compile_choice(compile))


def device_backend(device: torch.device | str) -> type[StepBackend]:
    """The backend class that answers for ``device`` outside an engine (synchronising,
    memory figures, the auto dtype: base.py's class-level device questions), whatever
    compile choice a step there would run with."""
    device = torch.device(device)
    return backend_class(device, "off" if device.type != "cuda" else "auto")


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work, as its step backend does (no-op on CPU): for code
    that times device work outside an engine (e.g. a method's prefill figures)."""
    device = torch.device(device)
    device_backend(device).synchronize_device(device)


def accelerator_backend() -> type[StepBackend] | None:
    """The backend class of this machine's accelerator: the highest-priority backend with a
    ``device_type`` this machine has a device of; None: none here (the host runs it). Found
    without ``backend_class``, so ``$LONGDOC_STEP_BACKEND`` (which picks step backends) does
    not hide the accelerator's own device answers (e.g. its random state for a checkpoint).

    Where torch sees no accelerator at all (``torch_sees_accelerator``) no backend module is
    imported to say so: they import the model stack (transformers, seconds), and a spec asking
    a GPU-less machine for GPUs is refused before any of it (pipeline/placement.py)."""
    if not torch_sees_accelerator():
        return None
    for cls in registry().values():
        if cls.device_type is not None and cls.device_count() > 0:
            return cls
    return None


def accelerator() -> torch.device | None:
    """The accelerator a process granted GPUs runs on: the device type of
    ``accelerator_backend()``; None: none here (the host runs it)."""
    cls = accelerator_backend()
    return torch.device(cls.device_type) if cls is not None else None


def accelerator_count() -> int:
    """Accelerator devices this machine has (of ``accelerator()``'s type; 0: none)."""
    cls = accelerator_backend()
    return cls.device_count() if cls is not None else 0


def torch_sees_accelerator() -> bool:
    """Whether torch finds a device of any accelerator type on this machine (CUDA, XPU, MPS,
    ...: ``torch.accelerator``, which every backend's ``device_count`` answers through; the
    base contract). False: only the host, and no backend can have a device. A torch without
    that API says True: the backends are asked one by one, as before."""
    api = getattr(torch, "accelerator", None)
    if api is None or not hasattr(api, "device_count"):
        return True
    return api.device_count() > 0
