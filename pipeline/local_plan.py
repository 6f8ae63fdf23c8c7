"""The plan's stages run in this process, without Ray: ``LocalPlan``.

Why: on one machine with one generate actor, Ray's processes (GCS, raylet, workers,
the streaming executor, the tokenize actor) do none of the model's work and compete
with it for the cores: on a 2-core CPU the same stages in one process ran the sample job
at the documents per hour of a plain transformers script, through Ray well below it, and
Ray's start delays the first row (figures: jobs/results/README.md, "CPU: the same night
on an Intel Xeon with AMX"). ``longdoc run --runner local`` (and ``auto`` without a cluster,
pipeline/cli.py) runs this instead of pipeline/plan.py's Ray Data plan.

Contract: ``LocalPlan(spec, run_id, run_date, output_root, skip, shards)``;
``batches()`` yields the figure tables ``WriteStage`` returns, one per generate
batch as it finishes (completion order), exactly what the Ray plan's
``iter_batches`` yields, so pipeline/runner.py treats both alike:
- The same stage objects in the same order: ReadDocuments (document error rows and
  the run's ledger, per input file in listed order), ``input.limit`` documents,
  ExpandRequests (minus ``skip``), then the model stages the Ray plan declares
  (pipeline/plan.py ``model_stages``: tokenize, a text-stage method such as rag,
  generate), each called with its declared batch size, then WriteStage (staged files
  named by their request ids, as Ray's).
- The generate stage is made once the first input file is read (model load and warm-up,
  before any request is tokenized), and not at all when no request is left to run (a
  rerun of a finished date: every request skipped); its declared ``in_flight`` batches of its ``batch_size`` are in its engine at once, from threads, as Ray calls one actor, so the engine's slots
  stay full across batches. One generate stage whatever ``resources.actors`` says.
- A stage that raises (a model that does not load, a broken device) ends the
  iteration with that exception: the runner's abort path turns every request
  without a row into a retryable error row, as when Ray gives up. Requests still in
  the engine then finish on daemon threads and are dropped, never written.
- ``stop(timeout)`` (an interrupt, pipeline/runner.py): the engine ends after the step
  in hand, its unfinished requests abandoned (they have no row; a rerun does them). The
  rows it had finished are not lost with the batches they sat in: ``stop`` stages them
  (the generate calls in flight return their finished rows, stages/generate.py) and
  returns those blocks' figure tables, as ``batches()`` would have yielded them.
- ``activity()``: what the run is doing between written rows, for the progress line
  (reading the first input file, loading the model; then the engine's rows decoding,
  prefilling and queued); ``progress()``: the engine's rows finished and decoding, with their
  tokens and its prefill share of time, once it is made, else None (the progress line's ETA); while
  ``batches()`` waits for the engine it calls ``on_wait`` every ``tick_s`` seconds.
- ``timeline`` (optional dict) receives wall-clock stamps (``time.time()``) and
  seconds for benchmarks (pipeline/bench/inprocess.py lists them) and, once the
  batches are done, the engine's own figures under ``engine``.
Imports no Ray; torch and the model stack are imported by ``batches()``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.plan import ModelStage, check_chain, model_stages, stage_chain
from pipeline.plan_inputs import ExpandRequests, ReadDocuments
from pipeline.progress import ticking
from pipeline.ray_console import MODEL_STACK_ENV
from schemas.output import error_cause
from schemas.spec import JobSpec
from stages.decoding.snapshot import engines_line

if TYPE_CHECKING:
    from stages.write import WriteStage


class LocalPlan:
    """The plan of pipeline/plan.py, executed on this process's threads (module docstring)."""

    def __init__(
        self,
        spec: JobSpec,
        run_id: str,
        run_date: str,
        output_root: str,
        skip: frozenset[str],
        shards: list[str],
        timeline: dict[str, Any] | None = None,
        on_wait: Callable[[], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        check_chain(stage_chain(spec))  # the wiring check the Ray plan makes, before any model loads
        self.spec, self.run_id, self.run_date = spec, run_id, run_date
        self.output_root, self.skip, self.shards = output_root, skip, shards
        self.timeline: dict[str, Any] = timeline if timeline is not None else {}
        self.on_wait, self.tick_s = on_wait, tick_s
        self._engine = None  # the generate stage's engine, once made
        self._service = None  # its EngineService, for stop()
        self._calls: _GenerateCalls | None = None  # the calls in flight, for stop()
        self._write: WriteStage | None = None
        self._started = False
        self._reading = False  # the first input file is being read (before the model loads)

    def activity(self) -> str:
        """What the run is doing now (see the module contract); "" before ``batches()`` starts."""
        if not self._started:
            return ""
        if self._engine is None:
            return "reading the first input file" if self._reading else "loading the model"
        return engines_line(self._engine.snapshot())  # as the Ray runner says its engines

    def progress(self) -> tuple[int, int, int, int, float] | None:
        """The engine's ``progress()`` once it is made (rows finished, their tokens, rows
        decoding, theirs, its prefill share of time); None before: the progress line's ETA
        counts this work."""
        engine = self._engine
        return engine.progress() if engine is not None else None

    def batches(self) -> Iterator[pa.Table]:
        """Figure tables of the written batches, as they finish (see the module contract)."""
        spec, tl = self.spec, self.timeline
        spec_json = spec.model_dump(mode="json")
        self._started = True
        for name, value in MODEL_STACK_ENV.items():  # what the Ray runner gives its workers
            os.environ.setdefault(name, value)  # (a user's own setting wins)
        from stages.listing import resolve_uri
        from stages.rows import batch_to_rows, rows_to_batch
        from stages.write import WriteStage

        stages = model_stages(spec)  # the Ray plan's stages, folded here into one process
        tl["t_imported"] = time.time()
        tl.update(read_s=0.0, documents=0, requests=0)
        chunks = self._request_batches(resolve_uri(spec.input.uri, self.run_date))
        self._reading = True
        # "reading the first input file": a large file or a slow store takes a while.
        with ticking(self.on_wait, self.tick_s):
            first = next(chunks, None)  # the first file read, so a rerun with nothing left loads no model
        self._reading = False
        if first is None:
            return
        *text_stages, gen = stages
        t0 = time.time()
        # Model load + engine warm-up, before any document. ``make`` is the class Ray's actor
        # pool gets (pipeline/stage_actors.py: the stage imported in its constructor), so
        # the stage itself is its ``stage``. "loading the model" may take minutes (a big
        # model, a slow disk, the CPU kernels' first timing): the line keeps moving.
        with ticking(self.on_wait, self.tick_s), _starting(gen.name):
            generate = gen.make(spec=spec_json).stage
        self._engine, self._service = generate.engine, generate.service
        tl["generate_init_s"] = time.time() - t0
        tl["t_generate_ready"] = time.time()
        made: list[tuple[ModelStage, Any]] = []
        tl["text_stage_init_s"] = 0.0
        for stage in text_stages:
            t0 = time.time()
            with _starting(stage.name):
                made.append((stage, stage.make(spec=spec_json)))
            tl["tokenize_init_s" if stage.name == "tokenize" else "text_stage_init_s"] = time.time() - t0
        write = self._write = WriteStage(self.output_root, self.run_date, self.run_id)
        calls = self._calls = _GenerateCalls(generate, gen.in_flight, self.on_wait, self.tick_s)
        tl.update(batches_in_flight=calls.limit, batch_size=gen.batch_size, tokenize_s=0.0, text_stage_s=0.0)

        def run_stage(stage: ModelStage, fn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            """``fn`` over ``rows`` in calls of the stage's own batch size, as Ray calls it."""
            out: list[dict[str, Any]] = []
            for i in range(0, len(rows), stage.batch_size):
                out.extend(batch_to_rows(fn(rows_to_batch(rows[i : i + stage.batch_size]))))
            return out

        try:
            for chunk in itertools.chain([first], chunks):
                tl.setdefault("t_first_start", time.time())
                for stage, fn in made:
                    t0 = time.time()
                    chunk = run_stage(stage, fn, chunk)
                    tl["tokenize_s" if stage.name == "tokenize" else "text_stage_s"] += time.time() - t0
                batch = rows_to_batch(chunk)
                while calls.full():
                    yield self._written(write, calls.next_done())
                tl.setdefault("t_first_submit", time.time())
                calls.submit(batch)
                if self.on_wait is not None:
                    self.on_wait()  # the line moves on (its total: the batch's file is read)
            while calls.pending:
                yield self._written(write, calls.next_done())
        finally:
            tl["engine"] = {**asdict(generate.engine.stats), "describe": generate.engine.describe()}
            if not calls.pending:  # after an abort the engine still holds rows: left to its daemon thread
                generate.service.close()

    def stop(self, timeout: float = 10.0) -> list[pa.Table]:
        """Stop the engine after its step in hand and stage the rows it had finished (see the
        module contract): the figure tables of the blocks written, [] before the engine exists.
        Waits up to ``timeout`` seconds for the engine's thread, then as long again for the
        calls in flight to return; a call that has not returned by then keeps its rows
        unwritten (the rerun does them)."""
        if self._service is None:
            return []
        self._service.stop(timeout)
        calls, written = self._calls, []
        if calls is None or self._write is None:
            return []
        deadline = time.monotonic() + timeout
        while calls.pending and time.monotonic() < deadline:
            try:
                batch = calls.next_done(deadline - time.monotonic())
            except Exception:  # noqa: BLE001 - a call that failed now: its rows are the rerun's
                continue
            if batch is not None and len(batch.get("request_id", ())):
                written.append(self._written(self._write, batch))
        return written

    def _written(self, write, batch: dict) -> pa.Table:
        table = write(batch)
        self.timeline["t_last_written"] = time.time()
        return table

    def _request_batches(self, root_uri: str) -> Iterator[list[dict[str, Any]]]:
        """Requests in input order, ``resources.batch_size`` at a time, a document's requests
        never split (``batch_end``); the plan's read -> limit -> requests; the input files are
        read one by one, and a large one block by block, as the batches need them."""
        spec, tl = self.spec, self.timeline
        read = ReadDocuments(spec, root_uri, self.output_root, self.run_id, self.run_date)
        expand = ExpandRequests(spec, self.run_id, self.run_date, self.skip)
        limit, size = spec.input.limit, model_stages(spec)[-1].batch_size
        pending: list[dict[str, Any]] = []
        for index, shard in enumerate(self.shards):
            if limit is not None and tl["documents"] >= limit:
                break
            # The file's document tables as the read stage hands them on (a large file in
            # several: memory follows a block, not the file), one ahead: the read stage
            # records a file's requests in the ledger before its last table is taken (what
            # an abort or an interrupt names), so none of them reaches the engine first.
            tables = read(pa.table({"shard": [shard], "index": [index]}))
            t0 = time.time()
            ahead = next(tables, None)
            tl["read_s"] += time.time() - t0
            while ahead is not None:
                table, t0 = ahead, time.time()
                ahead = next(tables, None)
                tl["read_s"] += time.time() - t0
                docs = table.to_pylist()
                if limit is not None:
                    docs = docs[: max(0, limit - tl["documents"])]
                tl["documents"] += len(docs)
                for doc in docs:
                    pending.extend(expand(doc))
                while len(pending) >= size:
                    end = batch_end(pending, size)
                    tl["requests"] += end
                    yield pending[:end]
                    pending = pending[end:]
        if pending:
            tl["requests"] += len(pending)
            yield pending


def batch_end(rows: list[dict[str, Any]], size: int) -> int:
    """How many of ``rows`` (requests, each document's together, as expanded) the next batch
    takes: ``size``, and the rest of the document the last of them belongs to. Why: a
    method that reads a document once for all its questions (Finch's chunk reading) reads
    the questions that reach the engine together; a document split across two calls was
    read twice when the second call came after the reading had started (the sample QA job,
    3 questions a document in batches of 4: one document in eight, ~10% of its reading).
    The prefix cache of ``none``/``truncate`` gains the same way. A batch grows by at most
    a document's questions less one."""
    end = min(size, len(rows))

    def document(r: dict[str, Any]) -> tuple[Any, Any]:
        return r.get("doc_id"), r.get("source_uri")

    while 0 < end < len(rows) and document(rows[end]) == document(rows[end - 1]):
        end += 1
    return end


class StageStartError(RuntimeError):
    """A stage could not start (its model or tokenizer did not load): a rerun alone does not
    heal it, so the run's abort line says to fix the cause first (pipeline/cli.py)."""


@contextlib.contextmanager
def _starting(stage: str) -> Iterator[None]:
    """Name the stage whose start failed, as a Ray actor's creation failure is named
    (schemas/output.py ``error_cause``)."""
    try:
        yield
    except Exception as e:
        raise StageStartError(f"the {stage} stage could not start: {error_cause(e)}") from e


class _GenerateCalls:
    """Up to ``limit`` calls of the generate stage at once, each on a daemon thread.

    Daemon threads, not a ThreadPoolExecutor: after an abort, calls still waiting on the
    engine must not keep the process from exiting (an executor's threads are joined at
    interpreter exit). Results come back in completion order; a call's exception is
    raised by ``next_done``.
    """

    def __init__(self, stage, limit: int, on_wait: Callable[[], None] | None, tick_s: float) -> None:
        self.stage, self.limit = stage, limit
        self.on_wait, self.tick_s = on_wait, tick_s
        self.pending = 0
        self._done: queue.Queue[tuple[dict | None, BaseException | None]] = queue.Queue()

    def full(self) -> bool:
        return self.pending >= self.limit

    def submit(self, batch: dict) -> None:
        def call() -> None:
            try:
                self._done.put((self.stage(batch), None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, who raises it
                self._done.put((None, e))

        self.pending += 1
        threading.Thread(target=call, name="longdoc-generate-call", daemon=True).start()

    def next_done(self, timeout: float | None = None) -> dict | None:
        """The next finished call's output batch (blocks, calling ``on_wait`` every
        ``tick_s``); its exception if it raised; None if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.tick_s if deadline is None else max(0.0, min(self.tick_s, deadline - time.monotonic()))
            try:
                out, error = self._done.get(timeout=wait)
                break
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                if self.on_wait is not None:
                    self.on_wait()
        self.pending -= 1
        if error is not None:
            raise error
        assert out is not None
        return out
