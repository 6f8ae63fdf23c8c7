"""One decode step over ``SlotCache`` rows, optionally compiled, and a prefill chunk: ``SlotStep``.

Contract: ``SlotStep(view, cache, compile=...)`` runs ``view`` (a step backend's
forward.decode_view of the model, with the backend's attention installed) over ``cache``. ``step(feed, span)`` feeds ``feed`` ``[b, T]`` (row i: its last
emitted token, then its drafts, then padding; ``n_fed[i]`` = 1 + drafts) to the
first ``b`` slots and returns logits ``[b, T, V]`` float32. ``greedy(feed, n_fed,
span)`` also decides acceptance ON THE DEVICE (verify.greedy_accept): ``best``
``[b, T]`` and ``accepted`` ``[b]``, with no host sync. Neither advances the cache:
the caller does (``SlotCache.advance``) once it knows the accepted counts.
``prefill(writer, ids, first_pos)`` runs one prefill chunk ``[T]`` of one row into
its slot through a ``slots.RowWriter`` (eager, never compiled: prefill shapes vary)
and returns the logits ``[V]`` float32 of its last token.

Shapes: the step backend chooses them (backends/). On CUDA ``b`` and ``T`` come from
small bucket lists (``bucket``), the span from ``span_buckets``, and batch, width and
span are symbolic sizes to the compiler (``_mark``), so it compiles a few graphs per
cache capacity S whatever the bucket lists; with ``mode="reduce-overhead"`` a CUDA
graph is recorded once per concrete (batch, width, span) and replayed after
(tests/stages/decoding/test_slot_step.py ``CompileCounter`` counts compilations). The ``cudagraphs`` backend
compiles nothing: it captures the eager step once per concrete shape
(backends/cuda_graphs.py). On CPU the step is eager and
every size is exact (no padding rows or slots to compute).

Mask: query t of row b sits at slot ``length[b] + t`` and sees slots ``<= length[b]
+ t`` ([b, 1, T, L] bool): its own context, the real tokens fed before it, and
never padding (padding only follows the real tokens) or stale slots past it.

Span: a step attends over the first ``L`` slots only, the smallest span covering
``max(length) + T`` of the rows fed. Why: attention over the whole capacity made a
Finch row kept to 1k tokens decode as slowly as an 8k row in an 8k-capacity engine
(measured: jobs/results/code-choices.md, "stages/decoding/slot_step.py"). The span is the length of the ``slot_ids`` input, one more symbolic
size, so it costs no compilation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from stages.decoding.forward import cache_kwargs
from stages.decoding.slots import RowWriter, SlotCache
from stages.decoding.verify import greedy_accept

# Graphs per compiled function we allow before dynamo falls back to eager: one per
# (batch bucket, width bucket) and cache size; the defaults (8) are too few.
RECOMPILE_LIMIT = 256


def bucket(n: int, sizes: Sequence[int]) -> int:
    """The smallest size in ``sizes`` (ascending) that is >= n; ValueError past the last."""
    for s in sizes:
        if s >= n:
            return s
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


# Dynamo compiles sizes 0 and 1 apart from larger ones (and width 2 makes the draft
# axis, T - 1, a size 1): the buckets avoid batch 1 and width 2 where they can, so a
# step compiles to few graphs (one per width class: 1 and >= 4, x batch >= 2). Padding
# batch 1 to 2 and 1 draft to 3 costs little where a step is bound by weight reads.


def batch_buckets(slots: int) -> tuple[int, ...]:
    """2, 4, 8, ... up to ``slots`` (always included); (1,) for a single slot."""
    if slots == 1:
        return (1,)
    sizes = [2]
    while sizes[-1] * 2 < slots:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != slots:
        sizes.append(slots)
    return tuple(sizes)


def width_buckets(max_drafts: int) -> tuple[int, ...]:
    """Step widths 1, 4, 8, ... (each at most half the widest) and ``1 + max_drafts``.

    A power of two close to the widest step would save little over it: 16 drafts
    give (1, 4, 8, 17), not (..., 16, 17); one draft gives (1, 2).
    """
    top = 1 + max_drafts
    sizes = [w for w in (1, 4, 8, 16, 32) if w < top and (w == 1 or 2 * w <= top)]
    return (*sizes, top)


def span_buckets(capacity: int, smallest: int = 256) -> tuple[int, ...]:
    """Attention spans: ``smallest``, twice that, ... below ``capacity``, then ``capacity``."""
    sizes = []
    while smallest < capacity:
        sizes.append(smallest)
        smallest *= 2
    return (*sizes, capacity)


def warm_up_shapes(
    batch_sizes: Sequence[int], widths: Sequence[int], spans: Sequence[int]
) -> list[tuple[int, int, int]]:
    """Every step shape (batch, width, span) a bucketed engine can run, largest first.

    A span shorter than the width is never chosen (a step's span covers its width). Why
    largest first (most tokens fed, then the longest span): captured CUDA graphs write
    their results into shared buffers that are replaced by larger ones as larger shapes
    come (cuda_graphs.SharedOutputs; earlier graphs keep the old buffer alive), and their
    temporaries come from one memory pool whose blocks are reused by later, smaller
    captures; the largest shape first allocates each buffer once, at its final size.
    """
    shapes = [(b, t, span) for b in batch_sizes for t in widths for span in spans if span >= t]
    return sorted(shapes, key=lambda s: (s[0] * s[1], s[2], s[1]), reverse=True)


def raise_recompile_limit(limit: int = RECOMPILE_LIMIT) -> None:
    """Let dynamo keep ``limit`` specialisations per function (names differ across torch versions)."""
    import torch._dynamo

    dyn = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(dyn, name):
            setattr(dyn, name, max(getattr(dyn, name), limit))


class SlotStep:
    """The step function over a SlotCache (see the module docstring)."""

    def __init__(
        self,
        view: torch.nn.Module,
        cache: SlotCache,
        compile: bool = False,
        compile_mode: str | None = None,
        backend: str | Callable = "inductor",
        min_span: int = 256,
        capture: Callable[[Callable, SlotCache], Callable] | None = None,
        warm_up_calls: int = 1,
    ) -> None:
        """``min_span``: the smallest attention span (span_buckets); tests lower it.
        ``capture``: instead of torch.compile, wrap the eager step functions as
        ``capture(fn, cache)`` (the CUDA backend's hand-captured graphs,
        backends/cuda_graphs.CapturedSteps: on torch 2.11 the compile backend's graph trees
        replayed a graph recorded for one width with inputs of another, and it copies the KV
        cache inside each graph, which ran out of memory (seen: jobs/results/code-choices.md,
        "stages/decoding/slot_step.py SlotStep capture")). ``warm_up_calls``: calls per
        shape that leave it ready (the backend knows; see ``warm_up_calls()``)."""
        self.view = view
        self.cache = cache
        self.min_span = min_span
        self._symbolic = False  # batch, width and span marked symbolic for torch.compile (_mark)
        self._slot_ids = torch.arange(cache.capacity, device=cache.length.device)
        self.head = self.view.get_output_embeddings()
        if self.head is None or getattr(self.view.config, "final_logit_softcapping", None):
            raise ValueError("the decode engine needs a plain output projection (no logit soft-capping)")
        self.compiled = compile
        name = backend if isinstance(backend, str) else type(backend).__name__
        self.how = f"compiled: {name}" + (f", {compile_mode}" if compile_mode else "") if compile else "eager"
        self._warm_up_calls = warm_up_calls
        if capture is not None:
            self._logits = capture(self._logits_eager, cache)
            self._greedy = capture(self._greedy_eager, cache)
        elif compile:
            self._symbolic = True
            raise_recompile_limit()
            # dynamic=False: nothing becomes symbolic by itself (a new cache capacity S
            # is a new graph); batch and width are marked symbolic on purpose (_mark).
            opts = {"mode": compile_mode} if compile_mode else {}
            self._logits = torch.compile(self._logits_eager, backend=backend, dynamic=False, **opts)
            self._greedy = torch.compile(self._greedy_eager, backend=backend, dynamic=False, **opts)
        else:
            self._logits, self._greedy = self._logits_eager, self._greedy_eager

    @property
    def spans(self) -> tuple[int, ...]:
        """The attention spans of the cache's current capacity (see the module docstring)."""
        return span_buckets(self.cache.capacity, self.min_span)

    def _span_ids(self, span: int | None) -> torch.Tensor:
        """slot_ids [L] = 0..L-1 (a view: no kernel), L = span or the capacity."""
        if self._slot_ids.numel() != self.cache.capacity:  # the cache grew
            self._slot_ids = torch.arange(self.cache.capacity, device=self.cache.length.device)
        if span is not None and not 0 < span <= self.cache.capacity:
            raise ValueError(f"span {span} outside 1..{self.cache.capacity} (the cache's capacity)")
        return self._slot_ids[: span or self.cache.capacity]

    def _logits_eager(self, feed: torch.Tensor, slot_ids: torch.Tensor) -> torch.Tensor:
        """feed [b, T] long, slot_ids [L] -> logits [b, T, V] float32; writes K/V at length + 0..T-1.

        Attends over slots 0..L-1: every row fed needs length + T <= L."""
        b, t = feed.shape
        cache = self.cache
        cols = torch.arange(t, device=feed.device)
        positions = cache.pos[:b, None] + cols  # [b, T]
        at = cache.length[:b, None] + cols  # [b, T] the slot each query writes
        mask = (slot_ids[None, None, :] <= at[:, :, None])[:, None]  # [b, 1, T, L]
        out = self.view.base_model(
            input_ids=feed, attention_mask=mask, position_ids=positions, use_cache=True,
            **cache_kwargs(self.view.base_model, cache),
        )
        return self.head(out.last_hidden_state).float()

    def _greedy_eager(
        self, feed: torch.Tensor, n_fed: torch.Tensor, slot_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """feed [b, T], n_fed [b], slot_ids [L] -> (best [b, T] long, accepted [b] long)."""
        best = self._logits_eager(feed, slot_ids).argmax(dim=-1)
        return best, greedy_accept(feed, best, n_fed)

    def _mark(self, feed: torch.Tensor, slot_ids: torch.Tensor, n_fed: torch.Tensor | None = None) -> None:
        """Batch, width and span as symbolic sizes, so inductor compiles a handful of
        graphs (size 1 and 2 get their own: dynamo specialises them) instead of one per
        (batch bucket, width bucket, span); CUDA graph trees still record one graph per
        concrete shape, which takes a replay, not a compilation."""
        if self._symbolic:
            torch._dynamo.maybe_mark_dynamic(feed, 0)
            torch._dynamo.maybe_mark_dynamic(feed, 1)
            torch._dynamo.maybe_mark_dynamic(slot_ids, 0)
            if n_fed is not None:
                torch._dynamo.maybe_mark_dynamic(n_fed, 0)

    @torch.inference_mode()
    def step(self, feed: torch.Tensor, span: int | None = None) -> torch.Tensor:
        """Logits [b, T, V] float32 for feed [b, T], attending over the first ``span``
        slots (default: all; see the module docstring)."""
        ids = self._span_ids(span)
        self._mark(feed, ids)
        return self._logits(feed, ids)

    @torch.inference_mode()
    def greedy(
        self, feed: torch.Tensor, n_fed: torch.Tensor, span: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(best [b, T], accepted [b]) decided on the device; ``span`` as in ``step``."""
        ids = self._span_ids(span)
        self._mark(feed, ids, n_fed)
        return self._greedy(feed, n_fed, ids)

    @torch.inference_mode()
    def prefill(self, writer: RowWriter, ids: torch.Tensor, first_pos: int) -> torch.Tensor:
        """One prefill chunk: ids [T] long of one row -> logits [V] float32 of its last token.

        Writes the chunk's keys/values into the writer's slot at its length, at RoPE
        positions ``first_pos + 0..T-1``, attending causally over the slot's earlier
        chunks (no mask tensor: forward.packed_gqa_sdpa builds the causal one, or uses
        the causal kernel for a first chunk). ``writer.commit`` is the caller's.
        """
        t = ids.shape[0]
        positions = torch.arange(first_pos, first_pos + t, device=ids.device)[None]  # [1, T]
        out = self.view.base_model(
            input_ids=ids[None], position_ids=positions, use_cache=True, **cache_kwargs(self.view.base_model, writer),
        )
        return self.head(out.last_hidden_state[0, -1]).float()

    def warm_up_calls(self) -> int:
        """Calls per shape that leave it ready, as the backend said: torch.compile's CUDA graph
        trees record a graph on a later call than the one that compiles (3 on CUDA); a
        hand-captured graph (backends/cuda_graphs.CapturedSteps) is recorded on its first
        call, and a compiled CPU step is ready after one (1)."""
        return self._warm_up_calls

    @torch.inference_mode()
    def warm_up(self, batch_sizes: Sequence[int], widths: Sequence[int], greedy: bool) -> None:
        """Run (and so compile or capture) every (batch bucket, width bucket, span), each
        ``warm_up_calls()`` times on free slots, in ``warm_up_shapes`` order.

        Writes only slots ``0..T-1`` of rows whose length is 0 (free) and advances
        nothing, so it must run while every slot is free.
        """
        if bool(self.cache.length.any()):
            raise RuntimeError("warm_up needs every slot free")
        dev = self.cache.length.device
        for b, t, span in warm_up_shapes(batch_sizes, widths, self.spans):
            feed = torch.zeros((b, t), dtype=torch.long, device=dev)
            n_fed = torch.full((b,), t, dtype=torch.long, device=dev)
            for _ in range(self.warm_up_calls()):
                if greedy:
                    self.greedy(feed, n_fed, span)
                else:
                    self.step(feed, span)
