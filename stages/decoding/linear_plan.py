"""The fastest CPU kernel for each small token count, measured on the model's own weights.

Why: a decode step feeds ``M = rows x width`` tokens through every ``nn.Linear``. On
a CPU the stock ``x @ W^T`` is a memory-bound matrix-vector product at ``M = 1``, but
for ``2 <= M <= ~8`` the BLAS picks matrix-matrix kernels that cost far more than
the extra arithmetic: on SmolLM2-135M, one thread, the linear layers of a step
took 39 ms at M = 1 and 68 ms at M = 2. The same product computed as ``(W @ x^T)^T``
(another BLAS kernel), or padded with zero rows to a larger ``M`` that happens to
be cheaper, often costs a fraction of that; which kernel wins depends on the BLAS
build and the CPU. Speculative verification and small batches pay this on every
step, so we time the candidates once on the model's linear stack and route each
``M`` to the winner.

Contract:
- ``plan_for(model, device, clock)`` returns the ``LinearPlan`` for this model
  (``None`` off CPU, for tiny models where it cannot matter, or when disabled with
  ``LONGDOC_LINEAR_PLAN=0``), timed with ``clock`` (the CPU step backend's clock).
  Calibration takes a few seconds and is cached on disk under
  ``$LONGDOC_CACHE/linear_plans`` keyed by CPU, torch version, threads and weight
  shapes, so an actor pays it once per machine. Nothing is kept in the process: the
  step backend that asked holds the plan (cpu_backend.py).
- ``LinearPlan.routes``: M -> (kernel, padded M), kernel ``"xwt"`` (stock) or ``"wxt"``;
  ``LinearPlan.cost(M)``: measured seconds of the linear stack at M under the plan
  (interpolated between measured points, extrapolated linearly past the last).
- ``route_linears(view, plan)``: turns every plain ``nn.Linear`` of ``view`` into a
  ``RoutedLinear`` (same weight and bias tensors) that runs the planned kernel for
  routed M; the result is the same product (float rounding may differ in the last
  bits, as with any change of BLAS kernel; zero padding rows never touch real rows).
  It edits the modules it is given, so it is only ever applied to a backend's own
  ``forward.decode_view`` copy, never to the caller's model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# Token counts we route; larger M are BLAS's home ground. Routing up to 128 was measured
# (2026-11-26, embedded model, two threads, 39 rows decoding): the plan then sent M = 39
# to the stock kernel padded to 40, and steps cost the same as with the stock kernel alone
# (264-326 ms either way, four alternations), for 13 s of calibration instead of a few.
ROUTE_MAX_M = 16
_PROBE_MS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64)
_MIN_WEIGHT_BYTES = 32 << 20  # below this (test models) the weights sit in cache: nothing to win
_PLAN_VERSION = 2  # bump when calibration changes: cached plans are then re-measured
_PAD_MARGIN = 0.97  # leave the stock choice only when another is clearly cheaper (timing noise)


@dataclass(frozen=True)
class LinearPlan:
    routes: dict[int, tuple[str, int]]  # M -> (kernel, padded M)
    times: dict[int, float] = field(default_factory=dict)  # probed M -> seconds of the stack

    def cost(self, m: int) -> float:
        """Seconds of the model's linear stack for ``m`` tokens under this plan."""
        ms = sorted(self.times)
        if m in self.times:
            return self.times[m]
        if m <= ms[0]:
            return self.times[ms[0]]
        hi = next((x for x in ms if x > m), None)
        lo = max(x for x in ms if x < m)
        if hi is None:  # past the last probe: extend the last segment's slope
            lo, hi = ms[-2], ms[-1]
        slope = (self.times[hi] - self.times[lo]) / (hi - lo)
        return self.times[lo] + slope * (m - lo)

    def shape(self, m: int) -> float:
        """``cost(m) / cost(1) - 1``: the step-cost feature adaptive.StepCost fits."""
        return self.cost(m) / self.cost(1) - 1.0

    def to_json(self) -> dict:
        return {"routes": {str(m): list(r) for m, r in self.routes.items()},
                "times": {str(m): t for m, t in self.times.items()}}

    @classmethod
    def from_json(cls, d: dict) -> LinearPlan:
        return cls({int(m): (r[0], int(r[1])) for m, r in d["routes"].items()},
                   {int(m): float(t) for m, t in d["times"].items()})


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """Plain float nn.Linear layers only: subclasses (quantised layers) keep their own forward."""
    return [
        m for m in model.modules()
        if type(m) is torch.nn.Linear and m.weight.is_floating_point()
    ]


def _matmul(kernel: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, in] (row-major), w [out, in] -> [M, out] (row-major)."""
    if kernel == "wxt":
        return torch.mm(w, x.t()).t().contiguous()
    return F.linear(x, w)


@torch.inference_mode()
def _time_stack(
    weights: list[torch.Tensor], m: int, kernel: str, clock: Callable[[], float], reps: int = 3
) -> float:
    """Best-of-reps seconds to run every weight once at M = m with one kernel."""
    gen = torch.Generator().manual_seed(m)  # a private generator: the global RNG is the user's
    xs = {w.shape[1]: torch.randn(m, w.shape[1], dtype=w.dtype, generator=gen) for w in weights}
    best = float("inf")
    for _ in range(reps):
        t = clock()
        for w in weights:
            _matmul(kernel, xs[w.shape[1]], w)
        best = min(best, clock() - t)
    return best


def calibrate(
    model: torch.nn.Module, clock: Callable[[], float] = time.perf_counter, max_m: int = ROUTE_MAX_M
) -> LinearPlan:
    """Time both kernels at every M <= max_m (and stock at larger probes); pick per M.

    Each M takes the cheapest (kernel, M') over M' >= M among the measured small
    sizes (zero-padding to M'); the stock kernel and no padding stay unless the
    alternative saves at least 3%.
    """
    weights = [lin.weight.detach() for lin in _linears(model)]
    best: dict[int, tuple[float, str]] = {}
    times: dict[int, float] = {}
    for m in _PROBE_MS:
        if m <= max_m:
            stock, alt = _time_stack(weights, m, "xwt", clock), _time_stack(weights, m, "wxt", clock)
            # The other kernel must win clearly: a tie is timing noise.
            best[m] = (alt, "wxt") if alt < _PAD_MARGIN * stock else (stock, "xwt")
        else:
            times[m] = _time_stack(weights, m, "xwt", clock, reps=2)
    routes: dict[int, tuple[str, int]] = {}
    small = sorted(best)
    for m in range(1, max_m + 1):
        own = best.get(m) or best[min(x for x in small if x > m)]
        target = m if m in best else min(x for x in small if x > m)
        for m2 in small:
            if m2 > m and best[m2][0] < _PAD_MARGIN * own[0]:
                own, target = best[m2], m2
        routes[m] = (own[1], target)
        times[m] = own[0]
    return LinearPlan(routes, times)


# --------------------------------------------------------------------- disk cache
def _plan_key(model: torch.nn.Module) -> str:
    shapes = sorted({(tuple(lin.weight.shape), str(lin.weight.dtype)) for lin in _linears(model)})
    cpu = platform.processor() or platform.machine()
    try:  # the CPU model name says more than the architecture
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    raw = json.dumps([_PLAN_VERSION, cpu, torch.__version__, torch.get_num_threads(), shapes, len(_linears(model))])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def plan_for(
    model: torch.nn.Module, device: torch.device, clock: Callable[[], float] = time.perf_counter
) -> LinearPlan | None:
    """The routing plan for ``model`` on ``device``, timed with ``clock`` (see module contract)."""
    if device.type != "cpu" or os.environ.get("LONGDOC_LINEAR_PLAN", "1") == "0":
        return None
    lins = _linears(model)
    if sum(lin.weight.numel() * lin.weight.element_size() for lin in lins) < _MIN_WEIGHT_BYTES:
        return None
    key = _plan_key(model)
    from stages.model_loading import cache_dir

    path = cache_dir() / "linear_plans" / f"{key}.json"
    plan = None
    if path.is_file():
        try:
            plan = LinearPlan.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, OSError):
            plan = None  # unreadable: measure again
    if plan is None:
        t = time.perf_counter()
        plan = calibrate(model, clock)
        log.info("calibrated CPU linear kernels in %.1fs: %s", time.perf_counter() - t, plan.routes)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(plan.to_json()), encoding="utf-8")
            tmp.replace(path)
        except OSError as e:  # a read-only cache only costs the next process a calibration
            log.warning("could not cache the linear plan at %s: %s", path, e)
    return plan


# --------------------------------------------------------------------- routing
class RoutedLinear(torch.nn.Linear):
    """An ``nn.Linear`` that runs the planned kernel for its routed token counts.

    Made only by ``route_linears`` from a module of a decode view: it keeps the
    original's weight and bias tensors (shared with the caller's model).
    """

    routes: dict[int, tuple[str, int]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]: the stock product, by the kernel planned for M = x.numel() / in."""
        m = x.numel() // x.shape[-1] if x.dim() else 0
        route = self.routes.get(m)
        if route is None or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        kernel, padded = route
        x2 = x.reshape(m, x.shape[-1]).contiguous()  # row-major: the BLAS path we timed
        if padded > m:
            x2 = torch.cat([x2, x2.new_zeros(padded - m, x2.shape[1])])
        y = _matmul(kernel, x2, self.weight)[:m]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def route_linears(view: torch.nn.Module, plan: LinearPlan) -> int:
    """Route ``view``'s plain float linear layers by ``plan``; returns how many.

    ``view`` must be a decode view the caller owns (forward.decode_view): the modules
    are changed in place (class and ``routes``), their tensors are not.
    """
    lins = _linears(view)
    for lin in lins:
        lin.__class__ = RoutedLinear
        lin.routes = plan.routes
    return len(lins)
