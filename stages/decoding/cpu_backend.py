"""The CPU step backend: the measured linear-kernel plan and a CPU-time clock.

Contract: ``CpuBackend(model)`` implements backend.StepBackend on the CPU. Its forward
runs a decode view of ``model`` (forward.decode_view: same weights, own module
objects); ``warm_up()`` measures or reads the linear-kernel plan
(linear_plan.plan_for, cached on disk) and routes the VIEW's linear layers by it,
so the caller's model keeps its stock ``nn.Linear`` modules and forwards, during
decoding and after. No plan (tiny model, ``LONGDOC_LINEAR_PLAN=0``): the view runs
stock kernels and the step cost uses the plain ``[M > 1]`` jump.

Clock: with one torch intra-op thread the forward runs on the calling thread, so
its CPU time (``time.thread_time``) is the step's cost and leaves out bursts of
other processes that would otherwise teach the cost model noise; with more threads
the work is spread over a pool and only wall time (``time.perf_counter``) covers
it. The rule is fixed when the backend is made (the actor sets its thread count
first), and the plan is calibrated with the same clock.
"""

from __future__ import annotations

import time

import torch

from stages.decoding.adaptive import default_cost_prior, step_indicator
from stages.decoding.backend import EagerBackend
from stages.decoding.linear_plan import LinearPlan, plan_for, route_linears


class CpuBackend(EagerBackend):
    """The CPU step (see module docstring); the forward is the eager one, on the routed view."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, torch.device("cpu"))
        self.plan: LinearPlan | None = None
        self._timer = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        self._ready = False

    def warm_up(self) -> None:
        """Measure (or read from the disk cache) the kernel plan and route the view; once."""
        if self._ready:
            return
        self.plan = plan_for(self.view, self.device, self._timer)
        if self.plan is not None:
            route_linears(self.view, self.plan)
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
            routed = {m: r for m, r in self.plan.routes.items() if r != ("xwt", m)}
            plan = f"linear plan {routed or 'stock kernels everywhere'}"
        return f"cpu, {torch.get_num_threads()} thread(s), clock {self._timer.__name__}, {plan}"
