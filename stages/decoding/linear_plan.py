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
``M`` to the winner. A third candidate, where it is built (cpu_linear.py), is our own
kernel over weights packed once: from a few rows up to a few hundred it beats both BLAS
orders (M = 39: ~55-72 against ~74-93 ms for the embedded model's body linears), so it is
probed up to ``PACKED_MAX_M`` and routes every M it wins.

Contract:
- ``plan_for(model, device, clock)`` returns the ``LinearPlan`` for this model
  (``None`` off CPU, for tiny models where it cannot matter, or when disabled with
  ``LONGDOC_LINEAR_PLAN=0``), timed with ``clock`` (the CPU step backend's clock).
  Calibration takes seconds (~15 s for the embedded model with the packed kernel's
  probes, 2026-11-27, Xeon) and is cached on disk under
  ``$LONGDOC_CACHE/linear_plans`` keyed by CPU, torch version, threads and weight
  shapes, so an actor pays it once per machine. Nothing is kept in the process: the
  step backend that asked holds the plan (cpu_backend.py).
- ``LinearPlan.routes``: M -> (kernel, padded M), kernel ``"xwt"`` (stock), ``"wxt"``
  (M <= ``ROUTE_MAX_M``) or ``"packed"`` (M <= ``PACKED_MAX_M``);
  ``LinearPlan.cost(M)``: measured seconds of the linear stack at M under the plan
  (interpolated between measured points, extrapolated linearly past the last).
- ``route_linears(view, plan)``: turns every plain ``nn.Linear`` of ``view`` into a
  ``RoutedLinear`` (same weight and bias tensors) that runs the planned kernel for
  routed M; the result is the same product (float rounding may differ in the last
  bits, as with any change of BLAS kernel; zero padding rows never touch real rows).
  It edits the modules it is given, so it is only ever applied to a backend's own
  ``forward.decode_view`` copy, never to the caller's model. A plan with packed routes
  gives each routed layer a packed copy of its weight (memory: one more copy of the linear
  weights, so calibration leaves the packed kernel out when that copy would take more than
  a quarter of the available RAM).
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

from stages.decoding import cpu_linear

log = logging.getLogger(__name__)

# Token counts we route; larger M are BLAS's home ground. Routing up to 128 was measured
# (2026-11-26, embedded model, two threads, 39 rows decoding): the plan then sent M = 39
# to the stock kernel padded to 40, and steps cost the same as with the stock kernel alone
# (264-326 ms either way, four alternations), for 13 s of calibration instead of a few.
# (The packed kernel below is probed up to PACKED_MAX_M instead: it wins there.)
ROUTE_MAX_M = 16
# The packed kernel is probed and routed up to here: a CPU step of 39 rows x a width of a
# few tokens lands in the hundreds; at 256 rows the BLAS was already level with it.
PACKED_MAX_M = 256
_PROBE_MS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64, 96, 128, 192, 256)
_MIN_WEIGHT_BYTES = 32 << 20  # below this (test models) the weights sit in cache: nothing to win
_PLAN_VERSION = 3  # bump when calibration changes: cached plans are then re-measured
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

    def describe(self) -> str:
        """The routes that are not the stock kernel, as M ranges: '2-3: wxt, 9-16: packed'
        (padded routes say 'padded to M\'')."""
        parts: list[tuple[int, int, str]] = []
        for m in sorted(self.routes):
            kernel, padded = self.routes[m]
            if (kernel, padded) == ("xwt", m):
                continue
            what = kernel if padded == m else f"{kernel} padded to {padded}"
            if parts and parts[-1][1] == m - 1 and parts[-1][2] == what:
                parts[-1] = (parts[-1][0], m, what)
            else:
                parts.append((m, m, what))
        return ", ".join(f"{a}{'' if a == b else f'-{b}'}: {what}" for a, b, what in parts) or "stock kernels everywhere"

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


def _matmul(kernel: str, x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, in] (row-major), w [out, in] -> [M, out] (row-major); ``packed``: w packed
    by cpu_linear.pack (kernel "packed" only)."""
    if kernel == "wxt":
        return torch.mm(w, x.t()).t().contiguous()
    if kernel == "packed":
        return cpu_linear.linear(x, packed, w.shape[0])
    return F.linear(x, w)


@torch.inference_mode()
def _time_stack(
    weights: list[torch.Tensor], m: int, kernel: str, clock: Callable[[], float], reps: int = 3,
    packs: list[torch.Tensor] | None = None,
) -> float:
    """Best-of-reps seconds to run every weight once at M = m with one kernel."""
    gen = torch.Generator().manual_seed(m)  # a private generator: the global RNG is the user's
    xs = {w.shape[1]: torch.randn(m, w.shape[1], dtype=w.dtype, generator=gen) for w in weights}
    packs = packs or [None] * len(weights)
    best = float("inf")
    for _ in range(reps):
        t = clock()
        for w, p in zip(weights, packs):
            _matmul(kernel, xs[w.shape[1]], w, p)
        best = min(best, clock() - t)
    return best


def _available_ram() -> int:
    """Bytes of RAM the kernel says are available (MemAvailable); 0 where unknown."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            line = next(ln for ln in f if ln.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return 0


def _packed_weights(weights: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Every weight packed for the packed kernel, or None: the kernel is not in use, a weight
    is not float32, or one more copy of the weights would take over a quarter of the RAM."""
    if not cpu_linear.available() or any(w.dtype != torch.float32 for w in weights):
        return None
    if 4 * sum(w.numel() * w.element_size() for w in weights) > _available_ram():
        return None
    return [cpu_linear.pack(w) for w in weights]


def calibrate(
    model: torch.nn.Module, clock: Callable[[], float] = time.perf_counter, max_m: int = ROUTE_MAX_M
) -> LinearPlan:
    """Time the kernels at every probe M and pick per M.

    Up to ``max_m``: stock, transposed and (where built) packed; each M takes the cheapest
    (kernel, M') over M' >= M among the measured small sizes (zero-padding to M'). Past
    ``max_m``: stock and packed (up to ``PACKED_MAX_M``); each M takes the kernel that won at
    the first probe at or past it. The stock kernel and no padding stay unless another
    saves at least 3%.
    """
    weights = [lin.weight.detach() for lin in _linears(model)]
    packs = _packed_weights(weights)
    best: dict[int, tuple[float, str]] = {}
    times: dict[int, float] = {}
    large: dict[int, str] = {}  # probes past max_m -> the kernel that won there
    for m in _PROBE_MS:
        reps = 3 if m <= max_m else 2
        stock = _time_stack(weights, m, "xwt", clock, reps)
        others = {}
        if m <= max_m:
            others["wxt"] = _time_stack(weights, m, "wxt", clock, reps)
        if packs is not None and m <= PACKED_MAX_M:
            others["packed"] = _time_stack(weights, m, "packed", clock, reps, packs)
        kernel = min(others, key=others.get, default="xwt")
        # Another kernel must win clearly: a tie is timing noise.
        won = (others[kernel], kernel) if others and others[kernel] < _PAD_MARGIN * stock else (stock, "xwt")
        if m <= max_m:
            best[m] = won
        else:
            times[m], large[m] = won
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
    for m in range(max_m + 1, PACKED_MAX_M + 1):
        probe = min((p for p in large if p >= m), default=None)
        if probe is not None and large[probe] == "packed":
            routes[m] = ("packed", m)
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
    raw = json.dumps([_PLAN_VERSION, cpu, torch.__version__, torch.get_num_threads(), shapes, len(_linears(model)),
                      cpu_linear.status()])  # a plan made with the packed kernel needs it
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
    packed: torch.Tensor | None  # the weight packed by cpu_linear.pack, where a route is "packed"

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
        y = _matmul(kernel, x2, self.weight, self.packed)[:m]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def route_linears(view: torch.nn.Module, plan: LinearPlan) -> int:
    """Route ``view``'s plain float linear layers by ``plan``; returns how many.

    ``view`` must be a decode view the caller owns (forward.decode_view): the modules
    are changed in place (class, ``routes`` and ``packed``, a packed copy of the weight
    where the plan routes some M to the packed kernel), their tensors are not.
    """
    lins = _linears(view)
    uses_packed = any(kernel == "packed" for kernel, _ in plan.routes.values())
    packs = _packed_weights([lin.weight.detach() for lin in lins]) if uses_packed else None
    routes = plan.routes
    if uses_packed and packs is None:
        # A cached plan met a process where the kernel is off, a weight is not float32 or
        # the copy no longer fits the RAM: those M run on the BLAS.
        log.info("linear plan: packed routes run on the BLAS here (%s)", cpu_linear.status())
        routes = {m: r for m, r in plan.routes.items() if r[0] != "packed"}
    for i, lin in enumerate(lins):
        lin.__class__ = RoutedLinear
        lin.routes = routes
        lin.packed = packs[i] if packs is not None else None
    return len(lins)
