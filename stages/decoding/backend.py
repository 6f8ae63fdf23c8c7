"""What the decode loop needs from a device: the ``StepBackend`` interface.

The loop (engine.py) is the same on every device; a backend owns what differs:
- ``forward``: run one step, ``[B, T]`` new tokens (RoPE positions ``[B, T]``,
  real-token mask ``[B, T]``) on top of the KV buffer (``DynamicCache`` whose layers
  are kvbuffer.BufferLayer, validity ``[B, S]``), and return logits ``[N, V]``
  float32 for the flat slots ``pick`` ``[N]`` plus the new validity ``[B, S + T]``
  (the contract of forward.forward_pick). It runs the backend's own model view
  (forward.decode_view), so the caller's model is never modified.
- ``clock``: the one clock step cost is measured with on this backend (seconds;
  differences only). The loop reads it before and after ``forward`` plus
  verification, so on an accelerator it must wait for queued work.
- ``cost_prior`` / ``cost_shape``: what adaptive.StepCost starts from on this
  device: ``(c/a, j/a)`` and the kernel-cost shape ``h(M)``.
- ``warm_up()``: one-time set-up at actor start (CPU: measure or read the linear
  kernel plan); the engine state calls it once, before the first step.
- ``describe()``: one line for logs and benchmarks.

Backends (engine_state.backend_for picks one by device):
- cpu_backend.CpuBackend: measured linear-kernel plan, thread CPU time as clock.
- ``EagerBackend`` below: any other device (CUDA today), the plain eager forward,
  wall time after a device synchronise. Issue 12's CUDA backend (static KV slots,
  graph-captured steps) takes its place in backend_for; it will also own the KV
  layout that engine.py edits today (kvbuffer.adopt / keep_rows / compact).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from transformers import DynamicCache

from stages.decoding.adaptive import default_cost_prior, step_indicator
from stages.decoding.forward import decode_view, forward_pick


class StepBackend(Protocol):
    """One device's step: forward, clock, cost prior, set-up (see module docstring)."""

    device: torch.device

    def warm_up(self) -> None: ...

    def clock(self) -> float: ...

    def cost_prior(self) -> tuple[float, float]: ...

    def cost_shape(self, m: int) -> float: ...

    def forward(
        self,
        cache: DynamicCache,
        valid: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        new_valid: torch.Tensor,
        pick: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def describe(self) -> str: ...


class EagerBackend:
    """The eager forward on any device (CUDA today): no kernel plan, no graphs.

    Clock: ``perf_counter`` after the device's queued work has finished
    (``torch.cuda.synchronize``; ``torch.<device>.synchronize`` elsewhere), so a step
    is charged for its kernels, not for their launch; on CPU nothing is queued.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        self.view = decode_view(model)

    def warm_up(self) -> None:
        """Nothing to measure for the eager path."""

    def clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type != "cpu":
            getattr(torch, self.device.type).synchronize()  # mps, xpu, ...
        return time.perf_counter()

    def cost_prior(self) -> tuple[float, float]:
        return default_cost_prior(self.device.type)

    def cost_shape(self, m: int) -> float:
        return step_indicator(m)

    def forward(
        self,
        cache: DynamicCache,
        valid: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        new_valid: torch.Tensor,
        pick: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of [B, T] tokens on the view; (logits [N, V] float32, valid [B, S + T])."""
        return forward_pick(self.view, cache, valid, input_ids, positions, new_valid, pick)

    def describe(self) -> str:
        return f"eager on {self.device}"
