"""The decoding engine's per-actor state: ``EngineState``.

Contract: ``EngineState(model, device)`` is made once per actor (per model and
device) and passed to every ``engine.decode`` call. It holds everything the engine
learns while it decodes batch after batch:
- ``backend``: the device's step backend (backend.StepBackend), set up and warmed up
  here (on CPU: the measured linear-kernel plan);
- ``cost``: adaptive.StepCost, the step-cost model fitted from timed steps;
- ``acceptance``: adaptive.AcceptanceModel, acceptance by matched suffix length.
Nothing of it lives in module globals: two states (two actors, two models, a
benchmark's baseline and candidate) learn independently, and dropping the state
drops what it learned. A state is not thread-safe: one decode at a time.
"""

from __future__ import annotations

import torch

from stages.decoding.adaptive import AcceptanceModel, StepCost
from stages.decoding.backend import EagerBackend, StepBackend
from stages.decoding.cpu_backend import CpuBackend


def backend_for(model: torch.nn.Module, device: torch.device) -> StepBackend:
    """The step backend for ``device``: CPU -> CpuBackend; anything else -> EagerBackend.

    The seam for issue 12: a CUDA backend with static KV slots and graph-captured
    steps is chosen here for ``device.type == "cuda"`` once it exists.
    """
    if device.type == "cpu":
        return CpuBackend(model)
    return EagerBackend(model, device)


class EngineState:
    """What the engine knows about one model on one device (see module docstring)."""

    def __init__(
        self, model: torch.nn.Module, device: torch.device | None = None, backend: StepBackend | None = None
    ) -> None:
        device = torch.device(device) if device is not None else next(model.parameters()).device
        self.backend = backend if backend is not None else backend_for(model, device)
        self.backend.warm_up()
        self.cost = StepCost(self.backend.cost_prior(), shape=self.backend.cost_shape)
        self.acceptance = AcceptanceModel()

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def describe(self) -> str:
        return self.backend.describe()
