"""CUDA graphs of the eager decode step, captured by hand: ``CapturedSteps``.

Why not ``torch.compile(backend="cudagraphs")``: that backend runs the step through
AOTAutograd, which functionalises the in-place writes into the KV slots: every layer's
key and value tensors are copied whole inside the graph and written back at its end, so a
step holds a second copy of the KV cache, and a large model with long slots ran out of
memory warming up, whatever the KV budget (seen: jobs/results/code-choices.md,
"stages/decoding/backends/cuda_graphs.py"). Capturing the
eager step keeps the writes in place: the graph replays exactly the kernels the eager step
launches (so its outputs equal the eager step's, bit for bit), without the host's launch
cost, and warms up in a fraction of a second per shape instead of a compilation.

Contract: ``CapturedSteps(fn, cache)`` wraps ``fn(*tensors) -> tensor or tuple of
tensors`` (device work only: no host sync, no data-dependent Python branching).
``__call__(*args)``: the first call with a new combination of input shapes captures a
graph (after one eager run on a side stream, which also gives its result); later calls
copy the inputs into the graph's static buffers and replay it. Results are returned as
fresh tensors (copies of the graph's static outputs), so they stay valid across later
replays. Graphs read the cache's tensors by address, so every graph is dropped when the
cache is laid out again (``SlotCache.layout_version`` changed), and the next ones go to a
new memory pool. The graphs of one layout share one pool: they never run concurrently, and
each result is copied out before the next replay.

Memory: a graph's temporaries go back to the shared pool when its capture ends, so the
pool holds about one step's worth, whatever the number of shapes. Its results cannot: a
replay writes them at fixed addresses. Each graph therefore copies its results into
``SharedOutputs``, buffers outside the pool that every graph writes into (a view of its
shape), instead of keeping results of its own. Why: the engine captures every (batch,
width, span) shape at warm-up, and a sampling step's result is the logits [b, T, V] in
float32, so one result per graph would add up to the sum over shapes: for an 8B model
(V = 128,256) with 256 slots, widths 1/2/4/8 and four spans, ~16 GB beyond the memory
budget; shared, it is the largest result (~1 GB of it at b = 256, T = 8): the engine
warms up the largest shape first (slot_step.warm_up_shapes), so each buffer is allocated
once at its final size (in another order a buffer grows as larger shapes come, and the
smaller graphs keep the old one alive: up to about twice the largest result).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stages.decoding.slots import SlotCache


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # static buffers the replay reads
    outputs: tuple[torch.Tensor, ...]  # views of SharedOutputs' buffers the replay writes
    single: bool  # fn returned one tensor, not a tuple


class SharedOutputs:
    """Buffers that graphs of one function write their results into, one per result position.

    ``view(i, like)``: a tensor with ``like``'s shape and dtype at the start of buffer
    ``i`` (a strided view: ``buffer[:like.shape[0], :like.shape[1], ...]``). A buffer too
    small in any dimension is replaced by a new one covering both shapes, one of another
    dtype, rank or device by one of ``like``'s shape; the old one stays alive as long as
    views of earlier graphs hold it.
    Allocate views outside a graph capture (they must not come from the graph's pool).
    """

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = []

    def view(self, i: int, like: torch.Tensor) -> torch.Tensor:
        while len(self.buffers) <= i:
            self.buffers.append(None)
        buf = self.buffers[i]
        if buf is None or buf.dtype != like.dtype or buf.dim() != like.dim() or buf.device != like.device:
            buf = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        elif any(n > have for n, have in zip(like.shape, buf.shape, strict=True)):
            grown = tuple(max(n, have) for n, have in zip(like.shape, buf.shape, strict=True))
            buf = torch.empty(grown, dtype=like.dtype, device=like.device)
        self.buffers[i] = buf
        return buf[tuple(slice(0, n) for n in like.shape)]


class CapturedSteps:
    """One CUDA graph per input-shape combination of ``fn`` (see the module docstring)."""

    def __init__(self, fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], cache: SlotCache) -> None:
        if cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {cache.device}")
        self.fn = fn
        self.cache = cache
        self.graphs: dict[tuple, _Graph] = {}
        self._layout = cache.layout_version
        self._pool = torch.cuda.graph_pool_handle()
        self.shared = SharedOutputs()  # outside the pools: kept across relayouts
        # One side stream for every eager run before a capture: cuBLAS keeps a workspace per
        # (handle, stream), so a new stream per capture would leave one behind for each
        # stream of torch's pool (up to 32 of them, tens of MB each on recent GPUs).
        self._side = torch.cuda.Stream()
        self.captures = 0  # graphs captured over this object's life (read by the tests)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.cache.layout_version != self._layout:  # slots re-laid out: old addresses
            self.graphs.clear()
            # A new pool too: capturing into a pool whose graphs are all gone fails an
            # allocator assertion ("use_count > 0", CUDACachingAllocator.cpp; seen the first
            # time an engine re-laid out its slots: jobs/results/code-choices.md,
            # "stages/decoding/backends/cuda_graphs.py CapturedSteps.__call__").
            self._pool = torch.cuda.graph_pool_handle()
            self._layout = self.cache.layout_version
        key = tuple((tuple(a.shape), a.dtype) for a in args)
        entry = self.graphs.get(key)
        if entry is None:
            return self._capture(key, args)
        for buf, a in zip(entry.inputs, args):
            if buf.data_ptr() != a.data_ptr():
                buf.copy_(a)
        entry.graph.replay()
        out = tuple(o.clone() for o in entry.outputs)
        return out[0] if entry.single else out

    def _capture(self, key: tuple, args: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run ``fn`` eagerly once (its result is this call's), then record its graph."""
        inputs = tuple(a.clone() for a in args)
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            # The eager run: lazy set-up (cuBLAS handles, workspace) happens outside the
            # capture, and this call gets its result. Writes to the cache are the ones
            # the replay would make (the caller advances the rows afterwards).
            result = self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        single = isinstance(result, torch.Tensor)
        results = (result,) if single else tuple(result)
        outputs = tuple(self.shared.view(i, r) for i, r in enumerate(results))  # before the capture: not pool memory
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            produced = self.fn(*inputs)
            for out, value in zip(outputs, (produced,) if single else produced, strict=True):
                out.copy_(value)
        del produced  # back to the pool when the capture ends: the next graph's temporaries
        self.graphs[key] = _Graph(graph, inputs, outputs, single)
        self.captures += 1
        return result
