"""The one decode engine: continuous batching over KV slots, on CPU and GPU alike.

Contract: ``Engine(model, config, ...)`` is made once per generate actor (it owns the
KV slots, the step backend, the drafter and what it learns about step cost and
acceptance). ``submit(request)`` queues a ``Request``; ``step()`` runs one iteration
and returns the requests that finished in it (``Finished``: a ``RowResult`` or the
error that stopped the request); ``run(requests)`` submits and steps until those are
done and returns them in order. Requests may arrive while others decode: a row that
finishes frees its slot for the next waiting request at once, so the decode batch
stays full and only the last requests of a job form a tail. The engine knows nothing
about tokenization beyond ``decode_text`` (for stop strings) and nothing about Ray.

One iteration (``step``):
1. admission (``_admit``, by the rules of scheduler.py): the waiting request at the
   head of the queue is admitted when a slot is free and its KV tokens
   (``Request.kv_tokens`` + ``max_new_tokens`` + the widest step) fit a slot. A
   request larger than the slots makes the engine change its layout
   (``KvBudget.layout``: fewer, longer slots within the same memory) once enough rows
   have left; until then it waits, and so do the requests behind it (first come,
   first served). A request no layout of the budget can hold becomes an error
   (``KvBudgetExceeded``); nothing is allocated past the budget.
2. prefill, chunked and interleaved with decoding: a text-compressed or whole prompt
   is prefilled by the engine itself, straight into its slot (slots.RowWriter), in
   chunks of ``chunk_tokens`` counted from the row's own start (so a row's KV never
   depends on its neighbours); an iteration takes chunks (of one row, then the next)
   until it has prefilled ``chunk_tokens`` prompt tokens (a per-iteration token budget,
   as vLLM's; with the prefix cache on, a prompt's part before the question and the
   question, two chunks, share an iteration where the budget holds both),
   so short prompts do not each cost the running rows a decode step of their own (a
   step's weight reads cost the same at any width). A method's own prefill (Finch,
   AutoCompressor: the ``prefill`` callable) runs for a group of up to ``group_rows``
   requests and is handed an ``on_chunk`` callback, when it accepts one, through which
   the engine runs decode steps between its chunks. Either way running rows keep decoding while
   newcomers prefill; the time they wait is ``stats.stall_s``. One exception, for method
   prefills: while waiting requests would be admitted into free slots right away
   (``Scheduler.admits_next``), the engine starts them before its next decode step
   ("fill first"). Why: a decode step reads every weight whatever its width, so steps
   taken while the batch is still filling cost nearly a full step each and advance only
   a few rows (jobs/results/bench-job/README.md has the night it changed). Once the slots are full (a night's steady state), steps run between a
   newcomer's chunks as before; and once the running rows have waited
   ``FILL_FIRST_MAX_WAIT_S`` since their last step, they get one between chunks or groups
   however many rows wait (one long document's reading must not hold every other row). With the prefix cache on
   (``prefix_cache``, prefix_cache.py), the engine's own prefill ends a chunk where the
   question starts; that prefix's KV is stored after its last chunk, and a later request
   with the same prefix copies it into its slot and prefills its question alone.
3. one decode step over the active rows (slots ``0..n-1``): each row's drafter
   proposal (drafters/; capped by adaptive.DraftLengths and the width rule
   adaptive.choose_width, which maximises tokens per second while requests wait and
   accounts for the batch's slowest row once none do), one forward pass of the step
   backend (backends/: eager steps of exact shapes on CPU, CUDA graphs (captured, or compiled)
   over bucketed shapes), verification on the device (verify.py: greedy match, or
   Leviathan's rule with keyed uniforms) and ONE host transfer. Finished rows leave;
   the last active row moves into the freed slot, so active rows stay packed.

Exactness: greedy output equals plain greedy decoding (reference.py; transformers'
``generate``) token for token in fp32, with or without drafts, in any batch and
admission order; sampling keeps the model's distribution and a request samples the
same text in any batch (its uniforms are keyed by its seed and output position). In
bf16 the reduction order differs between step widths and batch sizes, so agreement
is measured, not assumed.

Failures: a request whose prefill raises is retried alone up to ``max_retries``
times, then finishes with the error; a decode step that raises sends every active row
back to the queue (attempts + 1) the same way. Counts in = counts out.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace

import torch

from stages.decoding.adaptive import (
    AcceptanceModel,
    DraftLengths,
    StepCost,
    Tuning,
    choose_width,
    explore_width,
)
from stages.decoding.backends import StepBackend, backend_for
from stages.decoding.config import DecodeConfig, RowResult
from stages.decoding.drafters import Drafter, drafter_for
from stages.decoding.forward import check_engine_model
from stages.decoding.memory import KvBudget, budget_bytes_for, step_reserve_bytes
from stages.decoding.prefix_cache import PrefixCache
from stages.decoding.request import Finished, Request
from stages.decoding.sampling import target_probs
from stages.decoding.scheduler import Admit, KvBudgetExceeded, Reject, Relayout, Scheduler, Waiting
from stages.decoding.slot_step import width_buckets
from stages.decoding.slots import RowWriter, SlotCache, bytes_per_token, layer_shapes_of
from stages.decoding.snapshot import EngineSnapshot, describe
from stages.decoding.state import CompressedPrefill
from stages.decoding.stops import StopChecker
from stages.decoding.verify import sample_accept

#: A method's prefill strategy (compression.base.Loaded.prefill): B prompts -> a state
#: whose cache the engine loads into slots. It may accept ``on_chunk``, a callable
#: the engine runs decode steps through between the method's chunks.
MethodPrefill = Callable[..., CompressedPrefill]

#: The prefix cache's share of the KV budget when it is on: room for a few documents'
#: prefixes at once (requests of one document arrive together), taken from the slots.
PREFIX_CACHE_SHARE = 1 / 8
# The longest the running rows wait for a decode step while the engine fills first. Why:
# a long Finch reading on a small CPU held the decoding rows for minutes (a trial in
# jobs/results/usability/2026-12-06-new-user-trials.md), while a few seconds still let a
# QA night's group prefills fill the slots before a step.
FILL_FIRST_MAX_WAIT_S = 5.0


@dataclass
class EngineStats:
    """What the engine did since it was made (for logs and benchmarks)."""

    steps: int = 0
    step_s: float = 0.0  # decode steps' device time
    prefill_s: float = 0.0  # prefill time (own chunks and method prefills)
    stall_s: float = 0.0  # prefill time while rows were decoding (they waited)
    rows_done: int = 0
    tokens_out: int = 0
    max_active: int = 0
    relayouts: int = 0  # slot layout changes (a new capacity or slot count)
    prefix_hits: int = 0  # rows whose shared prompt prefix came from the prefix cache
    prefix_reused_tokens: int = 0  # prompt tokens those rows did not prefill
    compressing: int = 0  # rows inside a method's prefill now (e.g. Finch's pass): the progress line
    compressing_tokens: int = 0  # their documents' tokens (each document once)
    chunks_read: int = 0  # chunks that prefill has read so far (its on_chunk calls): a long one moves
    chunks_total: int | None = None  # chunks it reads in all (its longest document / reading_chunk)
    reading_since: float = 0.0  # perf_counter when it started


@dataclass
class _Row:
    """One request occupying a slot (host-side mirror of its slot)."""

    rid: int  # engine row id (drafter and draft-length state key)
    waiting: Waiting
    length: int = 0  # slots filled (== SlotCache.length[slot] once a step is applied)
    result: RowResult = field(default_factory=RowResult)
    first_at: float = 0.0


@dataclass
class _Filling:
    """A request being prefilled by the engine itself, chunk by chunk, into ``slot``."""

    row: _Row
    slot: int
    writer: RowWriter
    ids: torch.Tensor  # [L] long, the whole prompt
    done: int = 0  # tokens prefilled
    started: float = 0.0
    shared: int = 0  # prompt tokens before the question (prefix cache on); chunks end there once
    store_key: tuple[int, ...] | None = None  # set: store the shared prefix's KV once it is prefilled


class Engine:
    """Continuous batching over KV slots (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: DecodeConfig,
        *,
        decode_text: Callable[[list[int]], str] | None = None,
        prefill: MethodPrefill | None = None,
        reading_chunk: int | None = None,
        budget: KvBudget | None = None,
        kv_memory_gb: float | None = None,
        kv_memory_fraction: float | None = None,
        slots: int | None = None,
        expected_tokens: int = 512,
        chunk_tokens: int | None = None,
        group_rows: int | None = None,
        compile: str | bool | None = "auto",
        compile_backend: Callable | None = None,
        backend: StepBackend | None = None,
        tuning: Tuning | None = None,
        min_span: int = 256,
        max_retries: int = 0,
        prefix_cache: bool = False,
    ) -> None:
        """Make the engine, its backend and slots.

        ``prefill``: a method's prefill strategy; None = the engine prefills whole
        prompts itself (e.g. none, truncate, rag, bm25). ``reading_chunk``: the document tokens
        it reads between two ``on_chunk`` calls (base.Loaded), for the progress line's chunk
        total and time left. ``budget``: the KV memory budget
        (default: ``kv_memory_gb``, else ``kv_memory_fraction`` of free device memory /
        available RAM, memory.budget_bytes_for); ``slots``: a fixed slot count instead
        (``resources.decode_slots`` as a number). ``expected_tokens``: the KV tokens a
        typical request holds after its prefill (the first layout's capacity, so a
        compiled engine rarely changes shape). ``chunk_tokens``: the engine's own prefill
        chunk and the prompt tokens after which an iteration stops starting chunks and
        runs its decode step (default: the backend's, 2048 on CPU, 4096 on CUDA). ``group_rows``:
        requests a method prefill takes at once (default: the backend's). ``compile``/``compile_backend``/``min_span``: the step
        backend's (backends.backend_for), or ``backend`` itself. ``prefix_cache``:
        prefill each prompt's part before the question once and reuse it for the requests
        that share it (prefix_cache.py), within ``PREFIX_CACHE_SHARE`` of the KV budget
        (taken from the slots' share); the engine's own prefill only.
        """
        check_engine_model(model)  # before the backend warms up: a refusal costs nothing
        self.model = model
        self.backend = backend or backend_for(model, None, compile, compile_backend, min_span)
        self.device = self.backend.device
        self.backend.warm_up()
        self.tuning = tuning or Tuning()
        self.prefill = prefill
        self.reading_chunk = reading_chunk
        self._prefill_takes_on_chunk = prefill is not None and "on_chunk" in inspect.signature(prefill).parameters
        self._interleaved_s = 0.0  # decode steps run inside the current method prefill (on_chunk)
        self._interleaved_wall_s = 0.0  # the same in wall seconds (the method's compress_s clock)
        self._in_flight = 0  # rows of the method prefill under way (not yet in slots)
        self.fill_first_max_wait_s = FILL_FIRST_MAX_WAIT_S
        self._last_step_at = time.perf_counter()  # the running rows' last decode step (or first join)
        self.group_rows = max(1, group_rows or self.backend.method_prefill_rows)
        self.chunk_tokens = chunk_tokens or self.backend.default_chunk_tokens
        self.max_retries = max_retries
        self.cost = StepCost(self.backend.cost_prior(), shape=self.backend.cost_shape)
        self.acceptance = AcceptanceModel()
        self.stats = EngineStats()
        self.configure(config, decode_text)
        shapes = layer_shapes_of(model)
        dtype = next(model.parameters()).dtype
        if budget is None:
            reserve = 0
            if self.backend.reserves_step_memory:
                reserve = step_reserve_bytes(model.config, 256, self._widest, self.chunk_tokens, dtype)
            fraction = self.backend.kv_memory_fraction if kv_memory_fraction is None else kv_memory_fraction
            budget = KvBudget(
                bytes_per_token(shapes, dtype),
                budget_bytes_for(self.backend.free_memory_bytes(), fraction, kv_memory_gb, reserve),
                fixed_slots=slots,
            )
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache and prefill is None:
            share = int(budget.budget_bytes * PREFIX_CACHE_SHARE)
            budget = replace(budget, budget_bytes=budget.budget_bytes - share)
            self.prefix_cache = PrefixCache(share)
        self.budget = budget
        layout = budget.layout(self._need(expected_tokens))
        if layout is None:
            raise KvBudgetExceeded(
                f"the KV memory budget ({budget.describe()}) holds no slot of {self._need(expected_tokens)} "
                "tokens; raise resources.kv_memory_gb / kv_memory_fraction or compress more"
            )
        n_slots, capacity = layout
        if self.backend.grows_slots and slots is None:
            # Start small and add slots as rows wait for them (the backend says why).
            n_slots = min(n_slots, 8)
        self.cache = SlotCache(shapes, n_slots, capacity, dtype, self.device, self.backend.indexed_slot_writes)
        self.step_fn = self.backend.make_step(self.cache)
        self.scheduler = Scheduler(budget, self._need, self.group_rows,
                                   grow_slots=self.backend.grows_slots and slots is None)
        self.active: list[_Row] = []
        self.filling: _Filling | None = None
        self._finished: list[Finished] = []
        self._next_rid = 0
        self._draft_steps = 0

    # ------------------------------------------------------------------ set-up
    def configure(self, config: DecodeConfig, decode_text: Callable[[list[int]], str] | None = None) -> None:
        """Decode with ``config`` from now on (only while idle: nothing queued or active)."""
        if getattr(self, "scheduler", None) and not self.idle():
            raise RuntimeError("configure needs an idle engine")
        if config.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
        self.config = config
        self.decode_text = decode_text
        self.stopper = StopChecker(config.eos_ids, config.max_new_tokens, config.stop_strings, decode_text,
                                   config.repeat_ngram)
        self.drafter: Drafter | None = drafter_for(config)
        self.k_max = config.num_draft_tokens if self.drafter is not None else 0
        self._widest = max(width_buckets(self.k_max)) if self.k_max else 1
        self.lengths = DraftLengths(self.k_max, self.tuning)

    def describe(self) -> str:
        prefixes = f", {self.prefix_cache.describe()}" if self.prefix_cache is not None else ""
        return (
            f"{self.cache.slots} slots x {self.cache.capacity} tokens ({self.budget.describe()}), "
            f"{self.backend.describe()}{prefixes}"
        )

    def warm_up(self, greedy: bool = True) -> None:
        """Compile every (batch bucket, width bucket, span) now, so no request pays for it."""
        if not self.backend.compiled:
            return
        widths = self.backend.widths(self.k_max) or (1,)
        from stages.decoding.slot_step import batch_buckets

        self.step_fn.warm_up(batch_buckets(self.cache.slots), widths, greedy)

    # ------------------------------------------------------------------ API
    def submit(self, request: Request) -> None:
        self.scheduler.push(Waiting(request, time.perf_counter()))

    @property
    def queue(self):
        """The waiting requests (scheduler.Waiting), head first."""
        return self.scheduler.queue

    def idle(self) -> bool:
        return not (self.scheduler.queue or self.active or self.filling)

    def pending(self) -> int:
        """Requests queued, prefilling or decoding."""
        return len(self.scheduler) + len(self.active) + (self.filling is not None)

    def snapshot(self) -> EngineSnapshot:
        """What the engine holds now and has done (stages/decoding/snapshot.py). Safe to
        call from another thread (counts read without a lock, so one may be a step old)."""
        active = list(self.active)
        st = self.stats
        compressing = st.compressing  # read once: the engine's thread may change it meanwhile
        reading = bool(compressing)
        done, total = st.chunks_read, st.chunks_total
        left = None
        if reading and total and 2 <= done < total:  # the rate of the reading so far
            left = (time.perf_counter() - st.reading_since) * (total - done) / done
        return EngineSnapshot(
            decoding=len(active), decoding_tokens=sum(len(row.result.tokens) for row in active),
            compressing=compressing, compressing_tokens=st.compressing_tokens if reading else 0,
            chunks_read=done if reading else 0, chunks_total=total if reading else None,
            reading_left_s=left, prefilling=int(self.filling is not None), queued=len(self.scheduler),
            rows_done=st.rows_done, tokens_out=st.tokens_out, prefill_s=st.prefill_s, step_s=st.step_s)

    def activity(self) -> str:
        """What the engine holds now, for a progress line: ``"3 decoding (41 tokens), 1
        prefilling, 5 queued"`` (snapshot.describe: the Ray runner's line sums engines with
        it). Safe to call from another thread, as ``snapshot``."""
        return describe(self.snapshot())

    def progress(self) -> tuple[int, int, int, int, float]:
        """(rows finished, their output tokens, rows decoding now, the tokens those have so
        far, the share of the engine's time spent prefilling): the work a progress line's
        ETA counts before the rows are written (a batch is written once its last row
        finishes; pipeline/progress.py). Safe from another thread, as ``snapshot``."""
        return self.snapshot().progress()

    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """One iteration (see the module docstring); the requests that finished in it."""
        spent = 0  # prompt tokens this iteration prefilled (its budget: chunk_tokens)
        while spent < self.chunk_tokens:
            grouped = self._admit()  # a method's group prefill runs whole in here (its own chunks)
            if self.filling is None:
                if grouped and self._fill_first() and not self._decode_overdue():
                    continue  # more waiting rows fit free slots: start them before a step
                break
            # the filling row's next chunk (its boundaries are its own: the budget only
            # decides how many chunks, of one row or the next, come before the decode step)
            spent += self._prefill_chunk()
        if self.active:
            self._guarded_decode_step()
        done, self._finished = self._finished, []
        return done

    def run(self, requests: Iterable[Request]) -> list[Finished]:
        """Submit ``requests`` and step until each has finished; results in request order."""
        requests = list(requests)
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("request keys must be unique within a run")
        for r in requests:
            self.submit(r)
        got: dict[Hashable, Finished] = {}
        while len(got) < len(requests):
            for f in self.step():
                got[f.key] = f
            if self.idle() and len(got) < len(requests):
                raise RuntimeError("the engine went idle with requests unfinished")
        return [got[k] for k in keys]

    # ------------------------------------------------------------------ admission
    def _need(self, kv_tokens: int) -> int:
        """Slots a row of ``kv_tokens`` prefilled tokens needs to decode to its end."""
        return kv_tokens + self.config.max_new_tokens + self._widest + 1

    def _admit(self) -> bool:
        """Carry out the scheduler's decisions until it starts a request or waits (step 1).

        At most one start a call (a row to prefill, or a method's group prefill, run here);
        ``step`` calls again while its prefill budget lasts, so the running rows get their
        decode step between budgets. Returns whether a method's group prefill ran.
        """
        while True:
            cache = self.cache
            d = self.scheduler.decide(len(self.active), cache.slots, cache.capacity, self.filling is not None,
                                      own_prefill=self.prefill is None)
            if isinstance(d, Relayout):
                self.cache.reshape(d.slots, d.capacity, keep=len(self.active))
                self.stats.relayouts += 1
                continue
            if isinstance(d, Reject):
                self._fail(d.waiting, d.error)
                continue
            if isinstance(d, Admit):
                if self.prefill is None:
                    self._start_filling(d.group[0])
                else:
                    self._method_prefill(d.group)
                    return True
            return False

    def _fill_first(self) -> bool:
        """A method prefill's engine: waiting requests would start in free slots now, so the
        running rows' decode step waits for them (step 2's "fill first")."""
        busy = len(self.active) + self._in_flight
        return self.prefill is not None and self.scheduler.admits_next(busy, self.cache.slots, self.cache.capacity)

    def _decode_overdue(self) -> bool:
        """Whether the running rows have waited ``fill_first_max_wait_s`` since their last step
        (or since the first of them joined): filling first gives way."""
        return bool(self.active) and time.perf_counter() - self._last_step_at >= self.fill_first_max_wait_s

    # ------------------------------------------------------------------ prefill
    def _new_row(self, waiting: Waiting) -> _Row:
        rid = self._next_rid
        self._next_rid += 1
        row = _Row(rid, waiting)
        row.result.queue_s = time.perf_counter() - waiting.submitted
        if self.drafter is not None:
            self.drafter.begin(rid, waiting.request.lookup_ids)
        return row

    def _start_filling(self, waiting: Waiting) -> None:
        row = self._new_row(waiting)
        slot = len(self.active)
        self.cache.free(slot)
        parts = waiting.request.parts
        full = parts.full_ids
        ids = torch.tensor(full, dtype=torch.long, device=self.device)
        if ids.numel() == 0:
            self._drop(row, ValueError("the prompt is empty"), retry=False)
            return
        shared, done, store_key = 0, 0, None
        before_query = len(full) - len(parts.query_ids)  # prefix + context tokens
        if self.prefix_cache is not None and 0 < before_query < len(full):
            # Every request's prefill is split where its question starts, hit or miss, so a
            # row's KV and text do not depend on whether a sibling came first.
            shared = before_query
            key = tuple(full[:shared])
            t0 = self.backend.clock()
            kv = self.prefix_cache.get(key)
            if kv is None:
                store_key = key
            else:
                done = self.cache.copy_in(slot, kv)
                row.result.cached_prompt_tokens = done
                self.stats.prefix_hits += 1
                self.stats.prefix_reused_tokens += done
                self._account_prefill(t0, [row])
        self.filling = _Filling(row, slot, self.cache.row_writer(slot), ids, done=done,
                                started=time.perf_counter(), shared=shared, store_key=store_key)

    def _prefill_chunk(self) -> int:
        """The filling row's next chunk (step 2); on its last chunk the row joins the batch.
        Returns the tokens prefilled (0 when it failed)."""
        f = self.filling
        assert f is not None
        t0 = self.backend.clock()
        try:
            end = f.shared if f.done < f.shared else f.ids.numel()
            chunk = f.ids[f.done : min(f.done + self.chunk_tokens, end)]
            logits = self.step_fn.prefill(f.writer, chunk, f.done)
            f.writer.commit(chunk.numel(), f.done + chunk.numel())
            f.done += chunk.numel()
            if f.store_key is not None and f.done == f.shared:
                assert self.prefix_cache is not None
                self.prefix_cache.put(f.store_key, self.cache.copy_out(f.slot, f.shared))
                f.store_key = None
        except Exception as e:  # noqa: BLE001 - the request fails, the engine goes on
            self.filling = None
            self.cache.free(f.slot)
            self._account_prefill(t0, [f.row])
            self._drop(f.row, e, retry=True)
            return 0
        self._account_prefill(t0, [f.row])
        if f.done < f.ids.numel():
            return chunk.numel()
        self.filling = None
        f.row.length = f.done
        f.row.result.context_tokens = len(f.row.waiting.request.parts.context_ids)
        if f.slot != len(self.active):  # rows left while it filled: close the gap
            self.cache.move(f.slot, len(self.active), f.done)
            self.cache.free(f.slot)
        self._join(f.row, logits[None])
        return chunk.numel()

    def _method_prefill(self, group: list[Waiting]) -> None:
        """A method's own prefill for ``group`` (decode steps run through on_chunk), then
        each row is loaded into a slot and joins the batch."""
        rows = [self._new_row(w) for w in group]
        self._interleaved_s = self._interleaved_wall_s = 0.0
        self._in_flight = len(group)
        t0 = self.backend.clock()
        w0 = time.perf_counter()
        try:
            parts = [w.request.parts for w in group]
            kwargs = {"on_chunk": self._between_chunks} if self._prefill_takes_on_chunk else {}
            assert self.prefill is not None
            self.stats.compressing_tokens = sum(len(c) for c in {tuple(p.context_ids) for p in parts})
            self.stats.chunks_read = 0
            self.stats.chunks_total = (-(-max(len(p.context_ids) for p in parts) // self.reading_chunk)
                                       if self.reading_chunk else None)
            self.stats.reading_since = time.perf_counter()
            self.stats.compressing = len(group)
            try:
                compressed = self.prefill(parts, **kwargs)
            finally:
                self.stats.compressing = 0
                self._in_flight = 0
        except Exception as e:  # noqa: BLE001 - retried alone (a group shares a failure)
            self._account_prefill(t0, rows)
            for row in rows:
                self._drop(row, e, retry=True, alone=len(rows) > 1)
            return
        wall = time.perf_counter() - w0 - self._interleaved_wall_s
        spent = self._account_prefill(t0, rows)
        # The method times its reading in wall seconds; the engine's clock may be the thread's
        # CPU time (one host thread: backends/torch_eager.py), which a loaded machine makes
        # smaller. compress_s is part of prefill_s, so it is read on the engine's clock.
        to_engine = min(1.0, spent / wall) if wall > 0 else 1.0
        state = compressed.state
        for j, row in enumerate(rows):
            row.result.context_tokens = compressed.context_tokens[j]
            if compressed.kept_positions is not None:
                row.result.kept_positions = list(compressed.kept_positions[j])
            if compressed.prefilled_positions is not None:
                row.result.prefilled_positions = list(compressed.prefilled_positions[j])
            row.result.compress_s = compressed.compress_s[j] * to_engine
            n = int(state.valid[j].sum())
            if self._need(n) > self.cache.capacity:
                # It kept more than its estimate: back to the queue with its true size (alone),
                # where the scheduler makes room for it like for any long request.
                row.waiting.request.kv_tokens = n
                self._drop(row, None, retry=True, alone=True, count=False)
                continue
            slot = len(self.active)
            try:
                row.length = self.cache.load(slot, state, j)
            except Exception as e:  # noqa: BLE001
                self._drop(row, e, retry=True, alone=True)
                continue
            self._join(row, state.last_logits[j : j + 1])

    def _between_chunks(self) -> None:
        """A method prefill's on_chunk: one decode step of the running rows (none while the
        slots are still filling, see ``_fill_first``, unless the rows are overdue)."""
        self.stats.chunks_read += 1
        if self.active and (not self._fill_first() or self._decode_overdue()):
            t0, w0 = self.backend.clock(), time.perf_counter()
            self._guarded_decode_step()
            self._interleaved_s += self.backend.clock() - t0
            self._interleaved_wall_s += time.perf_counter() - w0

    def _account_prefill(self, t0: float, rows: list[_Row]) -> float:
        """Charge the prefill since ``t0`` to ``rows`` (and to stall_s when rows were
        decoding), less the decode steps its ``on_chunk`` ran in between; returns it."""
        spent = self.backend.clock() - t0 - self._interleaved_s
        self._interleaved_s = 0.0
        self.stats.prefill_s += spent
        if self.active:
            self.stats.stall_s += spent
            for waiting_row in self.active:
                waiting_row.result.stall_s += spent
        for row in rows:
            row.result.prefill_s += spent / len(rows)
            row.result.device_s += spent / len(rows)
        return spent

    def _join(self, row: _Row, logits: torch.Tensor) -> None:
        """The row's first token (from its prefill's last logits [1, V]); it takes slot len(active)."""
        cfg = self.config
        if cfg.greedy:
            first = int(logits[0].argmax())
        else:  # output position 0, drawn with the request's own seed (verify.py)
            probs0 = target_probs(logits.float(), cfg.temperature, cfg.top_p, cfg.top_k)[:, None]  # [1, 1, V]
            zeros = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            _, tok = sample_accept(probs0, zeros, zeros[:, 0] + 1, self._seeds([row.waiting.request.seed]), zeros[:, 0])
            first = int(tok[0])
        slot = len(self.active)
        if not self.active:  # the running rows' wait for a step starts now
            self._last_step_at = time.perf_counter()
        self.active.append(row)
        self.stats.max_active = max(self.stats.max_active, len(self.active))
        if self._emit(row, [first]):
            self._leave(slot)

    # ------------------------------------------------------------------ decode
    def _guarded_decode_step(self) -> None:
        try:
            self._decode_step()
            self._last_step_at = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - every running row goes back to the queue
            rows = list(self.active)
            for s in range(len(rows)):
                self.cache.free(s)
            self.active = []
            for row in rows:
                self._drop(row, e, retry=True)

    def _decode_step(self) -> None:
        """One step over the active rows (step 3 of the module docstring)."""
        active = self.active
        n = len(active)
        drafts, levels = self._drafts() if self.drafter is not None else ([[]] * n, [0] * n)
        size = self.backend.batch(n, self.cache.slots)
        width = self.backend.width(1 + max(map(len, drafts)), self.k_max)
        feed_rows = [[row.result.tokens[-1], *d] + [0] * (width - 1 - len(d)) for row, d in zip(active, drafts, strict=True)]
        feed_rows += [[0] * width] * (size - n)  # free slots of the bucket: computed, ignored
        n_fed = [1 + len(d) for d in drafts] + [1] * (size - n)
        feed = torch.tensor(feed_rows, dtype=torch.long, device=self.device)  # [size, width]
        span = self.backend.span(max(row.length for row in active) + width, self.cache.capacity)
        t0 = self.backend.clock()
        if self.config.greedy:
            best, acc = self.step_fn.greedy(feed, torch.tensor(n_fed, device=self.device), span)
            packed = torch.cat([acc[:n, None], best[:n]], dim=1).tolist()  # the step's one host sync
            verdicts = [(r[0], d[: r[0]] + [r[1 + r[0]]]) for r, d in zip(packed, drafts, strict=True)]
            self.cache.advance(acc[:n])
        else:
            cfg = self.config
            probs = target_probs(self.step_fn.step(feed, span)[:n], cfg.temperature, cfg.top_p, cfg.top_k)  # [n, width, V]
            start = torch.tensor([len(row.result.tokens) for row in active], device=self.device)
            acc, tok = sample_accept(probs, feed[:n], torch.tensor(n_fed[:n], device=self.device),
                                     self._seeds([row.waiting.request.seed for row in active]), start)
            packed = torch.stack([acc, tok], dim=1).tolist()  # the step's one host sync
            verdicts = [(a, d[:a] + [t]) for (a, t), d in zip(packed, drafts, strict=True)]
            self.cache.advance(acc)
        spent = self.backend.clock() - t0  # the step has synchronised (results are on the host)
        self.cost.observe(size * width, spent)
        self.stats.steps += 1
        self.stats.step_s += spent
        done = []
        for s, (row, d, (a, out)) in enumerate(zip(active, drafts, verdicts, strict=True)):
            res = row.result
            res.decode_steps += 1
            res.draft_tokens += len(d)
            res.accepted_tokens += a
            res.device_s += spent / n
            row.length += a + 1
            if d:
                self.lengths.update(row.rid, len(d), a)
                self.acceptance.update(levels[s], len(d), a)
            if self._emit(row, out):
                done.append(s)
        for s in sorted(done, reverse=True):
            self._leave(s)

    def _drafts(self) -> tuple[list[list[int]], list]:
        """Per active row, the drafts to feed and their levels (step 3)."""
        active, cfg = self.active, self.config
        rooms = [max(0, cfg.max_new_tokens - len(row.result.tokens) - 1) for row in active]  # the bonus token needs a slot
        assert self.drafter is not None
        if cfg.adaptive:
            limits = [min(self.k_max, room, self.lengths.allowed(row.rid)) for row, room in zip(active, rooms, strict=True)]
        else:
            limits = [min(self.k_max, room) for room in rooms]
        proposals = self.drafter.propose([row.rid for row in active], limits)
        props = [p.tokens[:lim] for p, lim in zip(proposals, limits, strict=True)]
        levels = [p.level for p in proposals]
        if not cfg.adaptive or not any(props):
            return props, levels
        self._draft_steps += 1
        widths = self.backend.widths(self.k_max)
        remaining = [cfg.max_new_tokens - len(row.result.tokens) for row in active]
        width = choose_width(
            [len(p) for p in props], levels, self.acceptance, self.cost, self.tuning.min_gain, remaining,
            candidates=widths, fed_rows=self.backend.batch(len(active), self.cache.slots),
            refilling=bool(self.scheduler.queue) or self.filling is not None,
        )
        if self.tuning.explore_every and self._draft_steps % self.tuning.explore_every == 0:
            width = explore_width(width, max(map(len, props)), widths)  # see Tuning.explore_every
        return [p[: width - 1] for p in props], levels

    def _seeds(self, seeds: list[int]) -> torch.Tensor:
        """Request seeds as a [g] long device tensor (verify.uniforms keys on them)."""
        return torch.tensor([int(x) % (1 << 63) for x in seeds], dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ rows
    def _emit(self, row: _Row, toks: list[int]) -> bool:
        """Append tokens to the row (cut at a stop); True when it finished."""
        res = row.result
        start = len(res.tokens)
        res.tokens.extend(toks)
        keep, reason = self.stopper.scan(res.tokens, start)
        del res.tokens[keep:]
        now = time.perf_counter()
        if start == 0:
            row.first_at = now
            res.ttft_s = now - row.waiting.submitted
        if self.drafter is not None and reason is None:
            self.drafter.extend(row.rid, res.tokens[start:])
        if reason is None:
            return False
        res.finish_reason = reason
        res.decode_s = now - row.first_at
        return True

    def _leave(self, slot: int) -> None:
        """The row in ``slot`` finished: deliver it; the last active row moves into its slot."""
        row = self.active[slot]
        last = len(self.active) - 1
        if slot != last:
            moved = self.active[last]
            self.cache.move(last, slot, moved.length)
            self.active[slot] = moved
        self.active.pop()
        self.cache.free(last)
        self.lengths.forget(row.rid)
        if self.drafter is not None:
            self.drafter.finish(row.rid, row.result.tokens)
        self.stats.rows_done += 1
        self.stats.tokens_out += len(row.result.tokens)
        self._finished.append(Finished(row.waiting.request.key, row.result))

    def _drop(
        self, row: _Row, error: BaseException | None, retry: bool, alone: bool = False, count: bool = True
    ) -> None:
        """A row left before finishing: back to the queue (``count``: as a failed attempt) or,
        out of attempts, finished with ``error``."""
        self.lengths.forget(row.rid)
        if self.drafter is not None:
            self.drafter.finish(row.rid, [])
        w = row.waiting
        if not count or (retry and w.attempts < self.max_retries):
            self.scheduler.push(Waiting(w.request, w.submitted, w.attempts + int(count), alone or w.alone))
            return
        if error is None:
            error = RuntimeError("the row could not be placed in a slot")
        self._fail(w, error)

    def _fail(self, waiting: Waiting, error: BaseException) -> None:
        self.stats.rows_done += 1
        self._finished.append(Finished(waiting.request.key, None, error))

