"""The fastest way to run each small token count through a model's linear layers on this
CPU, measured once on the model's own weights: ``plan_for``, ``route_linears``.

Why: a decode step feeds ``M = rows x width`` tokens through every ``nn.Linear``. The stock
``x @ W^T`` is a memory-bound matrix-vector product at ``M = 1``, but for small ``M > 1``
the BLAS picks matrix-matrix kernels that can cost far more than the extra arithmetic. The
same product as ``(W @ x^T)^T`` (the BLAS's other operand order), padded with zero rows to
a cheaper ``M``, or through linear.c's packed kernel often costs a fraction of that, and
which wins depends on the BLAS build and the CPU (the packed kernel saved 8% of the sample
night on an AMD EPYC with AVX-512 and 3% on an Intel Xeon: jobs/results/cpu-kernels/). So
the candidates are timed once per machine on the model's linear stack and each ``M`` goes
to its winner. No library offers this: a BLAS tunes its kernels per shape, not per call
site's token count, and torch routes every ``F.linear`` to the same BLAS entry.

Contract:
- ``plan_for(model, clock)`` returns the ``LinearPlan`` for this model on the CPU (None for
  models whose linear weights are below ``MIN_WEIGHT_BYTES``: they sit in cache, nothing to
  win), timed with ``clock`` (the backend's step clock). Calibration takes seconds and is
  cached on disk under ``$LONGDOC_CACHE/linear_plans``, keyed by CPU, torch version,
  threads, weight shapes and the packed kernel's status, so an actor pays it once per machine.
- ``LinearPlan.routes``: M -> (kernel, padded M), kernel ``"xwt"`` (stock), ``"wxt"`` (M <=
  ``ROUTE_MAX_M``) or ``"packed"`` (M <= ``PACKED_MAX_M``); ``cost(M)``: measured seconds of
  the linear stack at M under the plan (interpolated between probes, extrapolated past the
  last); ``shape(M)``: ``cost(M) / cost(1) - 1``, the feature adaptive.StepCost fits.
- ``route_linears(view, plan)``: turns every plain float ``nn.Linear`` of ``view`` into a
  ``RoutedLinear`` (same weight and bias tensors) that runs the planned kernel for routed M;
  the product is the same (rounding may differ in the last bits, as with any change of
  BLAS kernel; zero padding rows never touch real rows). It edits the modules it is given,
  so it is only applied to a backend's own decode view, never to the caller's model. Packed
  routes give each layer a packed copy of its weight (one more copy of the linear weights:
  calibration leaves the packed kernel out when that copy would take over a quarter of the
  available RAM).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from stages.decoding.backends.cpu_native import linear as packed_kernel
from stages.decoding.backends.cpu_native.build import cpu_signature
from stages.decoding.memory import available_ram_bytes

log = logging.getLogger(__name__)

# Token counts the BLAS orders and padding are probed for; past this, padding stops paying
# and calibration time grows (jobs/results/code-choices.md, this module's section).
ROUTE_MAX_M = 16
# The packed kernel is probed and routed up to here: a CPU step of tens of rows times a
# width of a few tokens lands in the hundreds; at 256 rows the BLAS is level with it.
PACKED_MAX_M = 256
PROBE_MS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_WEIGHT_BYTES = 32 << 20  # below this (test models) the weights sit in cache: nothing to win
PLAN_VERSION = 4  # bump when calibration changes: cached plans are then measured again
PAD_MARGIN = 0.97  # leave the stock choice only when another is clearly cheaper (timing noise)


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


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """Plain float nn.Linear layers only: subclasses (quantised layers) keep their own forward."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.is_floating_point()]


def _matmul(kernel: str, x: torch.Tensor, w: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, in] (row-major), w [out, in] -> [M, out] (row-major); ``packed``: w packed by
    linear.pack (kernel "packed" only)."""
    if kernel == "wxt":
        return torch.mm(w, x.t()).t().contiguous()
    if kernel == "packed":
        return packed_kernel.linear(x, packed, w.shape[0])
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


def packed_weights(weights: list[torch.Tensor], ram_bytes: int | None = None) -> list[torch.Tensor] | None:
    """Every weight packed for the packed kernel, or None: the kernel is not in use, a weight
    is not float32, or one more copy of the weights would take over a quarter of the RAM
    (``ram_bytes``, default: what the host has available now)."""
    if not packed_kernel.available() or any(w.dtype != torch.float32 for w in weights):
        return None
    ram = available_ram_bytes() if ram_bytes is None else ram_bytes
    if 4 * sum(w.numel() * w.element_size() for w in weights) > ram:
        return None
    return [packed_kernel.pack(w) for w in weights]


def calibrate(
    model: torch.nn.Module, clock: Callable[[], float] = time.perf_counter, max_m: int = ROUTE_MAX_M,
    ram_bytes: int | None = None,
) -> LinearPlan:
    """Time the kernels at every probe M and pick per M.

    Up to ``max_m``: stock, transposed and (where in use) packed; each M takes the cheapest
    (kernel, M') over M' >= M among the measured small sizes (zero-padding to M'). Past
    ``max_m``: stock and packed (up to ``PACKED_MAX_M``); each M takes the kernel that won at
    the first probe at or past it. The stock kernel and no padding stay unless another
    saves at least 3%. ``ram_bytes`` as for ``packed_weights``.
    """
    weights = [lin.weight.detach() for lin in linears(model)]
    packs = packed_weights(weights, ram_bytes)
    best: dict[int, tuple[float, str]] = {}
    times: dict[int, float] = {}
    large: dict[int, str] = {}  # probes past max_m -> the kernel that won there
    for m in PROBE_MS:
        reps = 3 if m <= max_m else 2
        stock = _time_stack(weights, m, "xwt", clock, reps)
        others = {}
        if m <= max_m:
            others["wxt"] = _time_stack(weights, m, "wxt", clock, reps)
        if packs is not None and m <= PACKED_MAX_M:
            others["packed"] = _time_stack(weights, m, "packed", clock, reps, packs)
        kernel = min(others, key=others.get, default="xwt")
        # Another kernel must win clearly: a tie is timing noise.
        won = (others[kernel], kernel) if others and others[kernel] < PAD_MARGIN * stock else (stock, "xwt")
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
            if m2 > m and best[m2][0] < PAD_MARGIN * own[0]:
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
    lins = linears(model)
    shapes = sorted({(tuple(lin.weight.shape), str(lin.weight.dtype)) for lin in lins})
    raw = json.dumps([PLAN_VERSION, cpu_signature(), torch.__version__, torch.get_num_threads(), shapes, len(lins),
                      packed_kernel.status()])  # a plan made with the packed kernel needs it
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def plan_for(model: torch.nn.Module, clock: Callable[[], float] = time.perf_counter) -> LinearPlan | None:
    """The routing plan for ``model`` on this CPU, timed with ``clock`` (see module contract)."""
    lins = linears(model)
    if sum(lin.weight.numel() * lin.weight.element_size() for lin in lins) < MIN_WEIGHT_BYTES:
        return None
    from stages.cache_paths import cache_dir

    path = cache_dir() / "linear_plans" / f"{_plan_key(model)}.json"
    plan = None
    if path.is_file():
        try:
            plan = LinearPlan.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, OSError):
            plan = None  # unreadable: measure again
    if plan is None:
        # Said before it starts: on a large-vocabulary model it takes minutes on a laptop, and
        # the run's progress line shows only that the model is loading.
        gb = sum(lin.weight.numel() * lin.weight.element_size() for lin in lins) / 2**30
        log.warning("timing this CPU's linear kernels on the model's %.1f GB of linear weights, once per "
                    "machine and model (%s; later runs read it)", gb, path.parent)
        t = time.perf_counter()
        plan = calibrate(model, clock)
        log.info("calibrated CPU linear kernels in %.1fs: %s", time.perf_counter() - t, plan.describe())
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

    Made only by ``route_linears`` from a module of a decode view: it keeps the original's
    weight and bias tensors (shared with the caller's model).
    """

    routes: dict[int, tuple[str, int]]
    packed: torch.Tensor | None  # the weight packed by linear.pack, where a route is "packed"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]: the stock product, by the kernel planned for M = x.numel() / in."""
        m = x.numel() // x.shape[-1] if x.dim() else 0
        route = self.routes.get(m)
        if route is None or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        kernel, padded = route
        x2 = x.reshape(m, x.shape[-1]).contiguous()  # row-major: the layout that was timed
        if padded > m:
            x2 = torch.cat([x2, x2.new_zeros(padded - m, x2.shape[1])])
        y = _matmul(kernel, x2, self.weight, self.packed)[:m]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


def route_linears(view: torch.nn.Module, plan: LinearPlan, ram_bytes: int | None = None) -> int:
    """Route ``view``'s plain float linear layers by ``plan``; returns how many.

    ``view`` must be a decode view the caller owns (forward.decode_view): the modules are
    changed in place (class, ``routes`` and ``packed``, a packed copy of the weight where the
    plan routes some M to the packed kernel), their tensors are not. ``ram_bytes`` as for
    ``packed_weights``.
    """
    lins = linears(view)
    uses_packed = any(kernel == "packed" for kernel, _ in plan.routes.values())
    packs = packed_weights([lin.weight.detach() for lin in lins], ram_bytes) if uses_packed else None
    routes = plan.routes
    if uses_packed and packs is None:
        # A cached plan met a process where the kernel is off, a weight is not float32 or the
        # copy no longer fits the RAM: those M run on the BLAS.
        log.info("linear plan: packed routes run on the BLAS here (%s)", packed_kernel.status())
        routes = {m: r for m, r in plan.routes.items() if r[0] != "packed"}
    for i, lin in enumerate(lins):
        lin.__class__ = RoutedLinear
        lin.routes = routes
        lin.packed = packs[i] if packs is not None else None
    return len(lins)
