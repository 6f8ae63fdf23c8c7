"""Generate stage: compressed context -> answer/summary, one output row per request.

Ray: ``GenerateStage`` is the callable class of the generate actor pool. ``__init__``
starts ONE decode engine on a thread of its own, which loads the model (once per actor)
and then runs every forward pass: torch's work stays on one thread
(stages/decoding/engine.py behind decoding/service.py: continuous batching over KV
slots sized by a memory budget, prefill chunked and interleaved with decoding,
speculation through a drafter). ``__call__`` turns a batch of request rows (see
stages/rows.py) into a batch of output rows (schemas/output.py): it submits the
batch's requests to the engine and waits for them. The actor takes several batches at
once (pipeline/plan.py), so requests of later batches join the decode batch while
earlier rows still decode: the engine's slots stay full for the whole job.

Prefill strategies (infra/README.md, "Architecture": they need the generating model's weights, so they run
here) come from the compression method (stages/compression/, ``CompressionMethod.load``):
a whole prompt (the document as a text method kept it) is prefilled by the engine
itself, chunk by chunk; Finch's KV-cache compression and the AutoCompressor's summaries
are the method's own prefill, run by the engine when a slot frees. Prompt lookup always
searches the ORIGINAL document tokens + prompt + output so far, whatever the prefill kept.

Failure contract: a row that cannot be generated becomes a row with ``error`` set. The
engine retries a failing request alone, up to ``resources.max_retries`` more times, so
one bad request never takes others down with it. The one exception: a request the engine
abandoned on an interrupt (``stop()``, the local runner) has no row at all, not an error
row; the rows that finished before it are returned, and a rerun does the rest.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from dataclasses import replace

import numpy as np
import torch

from schemas import output as out_schema
from schemas.rows import GENERATE_NEEDS, GenerateInput, OutputRow, columns
from schemas.spec import JobSpec
from stages.compression import method_for
from stages.compression.base import CONTEXT_COLUMNS, spans_of
from stages.context_budget import over_context
from stages.decoding.backends import backend_class
from stages.decoding.config import RowResult, decode_config_for
from stages.decoding.engine import Engine, KvBudgetExceeded
from stages.decoding.request import Request
from stages.decoding.service import EngineInterrupted, EngineService
from stages.decoding.stops import cut_text
from stages.model_loading import pick_device
from stages.prompting import PromptBuilder
from stages.rows import batch_to_rows, error_message, rows_to_batch

log = logging.getLogger(__name__)


class GenerateStage:
    """TokenizedRow | CompressedRow batches -> OutputRow batches (schemas/rows.py)."""

    needs: tuple[str, ...] = GENERATE_NEEDS
    adds: tuple[str, ...] = columns(OutputRow)

    def __init__(self, spec: dict) -> None:
        self.spec = JobSpec.model_validate(spec)
        self._traced: set[str] = set()  # exception types whose stack this stage logged (stages/rows.py)
        res = self.spec.resources
        self.device = pick_device(res.num_gpus)
        # Before the model loads: the step backend's process settings (CPU: torch's threads
        # = the CPUs Ray granted this actor, and the allocator keeps freed memory). A run's
        # spec has a number here (pipeline/placement.py with_actor_cpus); "auto" is left to torch.
        self.backend_class = backend_class(self.device, self.spec.generation.compile)
        cpus = None if res.num_cpus == "auto" else res.num_cpus
        prepared = self.backend_class.prepare_process(self.device, cpus)
        if prepared:
            log.info("%s", prepared)
        self.method = method_for(self.spec.compression)
        # Ray runs several calls of this actor at once, and the engine thread decodes stop
        # strings and runs the method's prefill (which may tokenize): a fast tokenizer must
        # not be entered by two threads at a time (encoding mutates its settings). Re-entrant:
        # a prefill holding it runs decode steps that decode stop strings.
        self._tokenizer_lock = threading.RLock()
        # The model loads and the engine is built (warmed up, its CPU kernel plan measured,
        # so the first batch's figures do not include it) on the engine's own thread, the
        # one that then runs every step: torch's OpenMP work moved between threads slows
        # every CPU forward pass (service.py says why).
        self.service = EngineService(self._load_and_build)
        self.engine = self.service.engine
        log.info("decode engine: %s", self.engine.describe())

    def _load_and_build(self) -> Engine:
        """Load the model and tokenizer (setting the attributes that depend on them) and
        return the warmed-up engine; the engine learns step cost and acceptance across batches."""
        loaded = self.method.load(self.spec, self.device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self._full_prefill = loaded.full_prefill  # the whole prompt prefilled (text methods, none)
        # Output columns a text method adds beyond its context (e.g. rag's retrieval
        # figures) are copied as they are; context_tokens/compress_s are combined below.
        self._carried = tuple(
            c for c in self.method.adds if c in out_schema.OUTPUT_COLUMNS and c not in CONTEXT_COLUMNS
        )
        self.prompts = PromptBuilder(self.tokenizer)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.device_name = self.backend_class.device_name(self.device)
        self.decode_config = decode_config_for(self.spec.generation, self.tokenizer, self.model.generation_config)
        if not loaded.full_prefill:
            loaded = replace(loaded, prefill=self._locked(loaded.prefill))
        return make_engine(self.spec, loaded, self.device, self.decode_config, self._decode_text)

    # ------------------------------------------------------------------ batches
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Output rows for a batch of requests; thread-safe (Ray calls it for several batches at once)."""
        rows: list[GenerateInput] = batch_to_rows(batch)  # type: ignore[assignment]
        outputs: list[OutputRow | None] = [None] * len(rows)
        todo: list[int] = []
        for i, row in enumerate(rows):
            if row.get("error"):
                outputs[i] = self._output_row(row, None, error=row["error"])
            else:
                msg = self._precheck(row)
                if msg:  # too long for the model: the request itself is bad (final)
                    outputs[i] = self._output_row(row, None, error=msg, error_kind=out_schema.INPUT)
                else:
                    todo.append(i)
        for i, result in zip(todo, self._generate([rows[i] for i in todo]), strict=True):
            outputs[i] = result
        for row, o in zip(rows, outputs, strict=True):
            if o is None:
                continue
            # The row's own share of the device (its prefill + each step's time / rows in the
            # step); rows that never reached the engine cost nothing.
            device_s = o.get("device_s") or 0.0
            # Plus the text stage's seconds (schemas/output.py cost_usd): rag's embedding is as
            # much the method's cost as finch's reading, which device_s holds. Not for an error
            # row: it has no compress_s, and its cost is what its columns say (device_s).
            text_s = _text_compress_s(row) if o["error"] is None else 0.0
            out_schema.set_figures(o, device=self.device_name, device_s=device_s,
                                   cost_usd=out_schema.cost_usd(device_s, self.spec.cost.usd_per_device_hour, text_s))
        # A request an interrupt abandoned in the engine has no row (a rerun does it); the
        # rows finished before it are returned, so the interrupted run keeps them.
        return rows_to_batch([o for o in outputs if o is not None])  # type: ignore[arg-type]

    def _precheck(self, row: GenerateInput) -> str | None:
        """Reject requests that cannot fit the model, before they cost a forward pass."""
        if self.method.reads_any_length:
            return None  # e.g. finch, autocompressor: they read the document chunk by chunk
        ctx = row.get("context_ids") or row.get("doc_ids") or []
        with self._tokenizer_lock:
            need = len(ctx) + self.prompts.overhead_tokens(row["instruction"], row.get("question"))
        msg = self.max_context and over_context(row["doc_id"], need, self.spec.generation.max_new_tokens,
                                                self.max_context)
        return f"generate: {msg}" if msg else None

    def _generate(self, rows: list[GenerateInput]) -> list[OutputRow | None]:
        """The engine's rows for ``rows`` (one per row, in order; failures as error rows;
        None for a request an interrupt abandoned, stages/decoding/service.py)."""
        if not rows:
            return []
        parts = self._prompt_parts(rows)
        lookups, seeds = self._lookups_and_seeds(parts, rows)
        once = self.method.reads_once_per_document(self.spec)
        requests = [
            Request(key=i, parts=p, lookup_ids=lk, seed=sd, kv_tokens=self.method.kv_tokens(self.spec, p),
                    doc_key=hash((tuple(p.prefix_ids), tuple(p.context_ids))) if once else None,
                    doc_size=r.get("doc_requests") if once else None)
            for i, (p, lk, sd, r) in enumerate(zip(parts, lookups, seeds, rows, strict=True))
        ]
        outs: list[OutputRow | None] = []
        for row, part, done in zip(rows, parts, self.service.generate(requests), strict=True):
            if isinstance(done.error, EngineInterrupted):
                outs.append(None)
            elif done.result is None:
                err = done.error or RuntimeError("the engine returned no result")
                kind = out_schema.INPUT if isinstance(err, KvBudgetExceeded) else out_schema.classify_error(err)
                msg = error_message("generate", err, kind, self._traced)
                outs.append(self._output_row(row, None, error=msg, error_kind=kind))
            else:
                outs.append(self._success_row(row, done.result, part))
        return outs

    def _prompt_parts(self, rows: list[GenerateInput]) -> list:
        """The chat prompt of each row around its (possibly text-compressed) context."""
        with self._tokenizer_lock:
            return self._build_parts(rows)

    def _build_parts(self, rows: list[GenerateInput]) -> list:
        return [
            self.prompts.build(
                r.get("context_ids") if r.get("context_ids") is not None else r["doc_ids"],
                r["instruction"],
                r.get("question"),
            )
            for r in rows
        ]

    def _lookups_and_seeds(self, parts: list, rows: list[GenerateInput]) -> tuple[list[list[int]], list[int]]:
        """Prompt lookup's source (the ORIGINAL document in the prompt) and the per-request seed."""
        lookup = [p.prefix_ids + list(r["doc_ids"]) + p.query_ids for p, r in zip(parts, rows)]
        return lookup, [_row_seed(self.spec.generation.seed, r["request_id"]) for r in rows]

    def _success_row(self, row: GenerateInput, res: RowResult, part) -> OutputRow:
        context_tokens = res.context_tokens if res.context_tokens is not None else len(part.context_ids)
        prompt_tokens = len(part.prefix_ids) + context_tokens + len(part.query_ids)
        o = self._output_row(
            row, res, context_tokens=context_tokens, prompt_tokens=prompt_tokens,
            extra_compress_s=res.compress_s, prefill_s=res.prefill_s,
        )
        return out_schema.set_figures(o, device_s=res.device_s, kept_spans=self._kept_spans(row, res),
                                      context=self._context_text(res, part))

    def _context_text(self, res: RowResult, part) -> str | None:
        """The output's ``context`` (schemas/output.py) under ``output.keep_context``: the
        document tokens the model was given as text, decoded in the order it read them;
        None when the option is off or the method's prefill reads keys/values or summary
        vectors instead of text (kept_spans says what those kept)."""
        if not self.spec.output.keep_context:
            return None
        if res.prefilled_positions is not None:  # a method prefill of picked text (select, finch early_exit)
            ids = [part.context_ids[j] for j in res.prefilled_positions]
        elif self._full_prefill:  # the prompt as built: a text method's context, or the document
            ids = list(part.context_ids)
        else:
            return None
        # Special tokens kept: a document's own special tokens are text the model read too.
        with self._tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _kept_spans(self, row: GenerateInput, res: RowResult) -> list[int] | None:
        """The output's ``kept_spans`` (schemas/output.py): what the method's prefill
        reported, else the text method's ``context_spans``, else the whole document for a
        full prefill of it (none); None when nothing says which positions were read."""
        if res.kept_positions is not None:  # a layout may reorder them (relevance order)
            return spans_of(sorted(set(res.kept_positions)))
        if row.get("context_spans") is not None:
            return [int(x) for x in row["context_spans"]]
        if self._full_prefill and row.get("context_ids") is None and row.get("doc_tokens"):
            return [0, int(row["doc_tokens"])]
        return None

    def _locked(self, prefill):
        """``prefill`` run holding the tokenizer lock (keeps its ``on_chunk`` keyword)."""

        @functools.wraps(prefill)
        def run(parts, **kwargs):
            with self._tokenizer_lock:
                return prefill(parts, **kwargs)

        return run

    def _decode_text(self, tokens: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ------------------------------------------------------------------ rows
    def _output_row(
        self,
        row: GenerateInput,
        res: RowResult | None,
        error: str | None = None,
        error_kind: str | None = None,
        context_tokens: int | None = None,
        prompt_tokens: int | None = None,
        extra_compress_s: float = 0.0,
        prefill_s: float | None = None,
    ) -> OutputRow:
        if res is None:
            return out_schema.output_row(self.spec, row, error=error, error_kind=error_kind)
        text_compress_s = _text_compress_s(row)
        return out_schema.output_row(
            self.spec,
            row,
            error=error,
            error_kind=error_kind,
            context_tokens=context_tokens,
            compression_ratio=out_schema.compression_ratio(row.get("doc_tokens") or 0, context_tokens or 0),
            prompt_tokens=prompt_tokens,
            # Without the whitespace around it (a tokenizer's leading space, the newline before
            # EOS): an analyst's `output_text = '1 June 2026'` matches, and so do two runs' texts.
            output_text=cut_text(self._decode_text(res.tokens), self.decode_config.stop_strings).strip(),
            output_tokens=len(res.tokens),
            draft_tokens=res.draft_tokens,
            accepted_tokens=res.accepted_tokens,
            acceptance_rate=out_schema.acceptance_rate(res.accepted_tokens, res.draft_tokens),
            decode_steps=res.decode_steps,
            mean_accepted_per_step=out_schema.mean_accepted_per_step(len(res.tokens), res.decode_steps),
            compress_s=text_compress_s + extra_compress_s,
            prefill_s=prefill_s,
            ttft_s=res.ttft_s,
            decode_s=res.decode_s,
            e2e_s=text_compress_s + res.ttft_s + res.decode_s,
            queue_s=res.queue_s,
            stall_s=res.stall_s,
            cached_prompt_tokens=res.cached_prompt_tokens,
            finish_reason=res.finish_reason,
            **{c: row.get(c) for c in self._carried},
        )


def _text_compress_s(row: GenerateInput) -> float:
    """Seconds a text method (one that compresses before this stage, e.g. truncate, rag, bm25) spent on ``row`` before this stage: the
    ``compress_s`` the row carried in; 0 for the other methods (a method reading inside the
    engine reports its own compress_s later, and that time is in device_s)."""
    return float(row.get("compress_s") or 0.0)


def make_engine(spec: JobSpec, loaded, device: torch.device, config, decode_text) -> Engine:
    """The actor's engine for ``spec``: its KV budget, slots, prefill and compiled steps.

    ``resources.decode_slots``: ``auto`` admits rows by their KV tokens within the
    memory budget (``resources.kv_memory_gb``, else ``kv_memory_fraction`` of the
    device memory free after the weights, or of the RAM available on CPU); a number
    fixes the slot count. The method's own prefill (Finch, AutoCompressor) is used
    unless it is the plain full prefill, which the engine does itself, chunked.
    Compiled steps (CUDA) are warmed up here, once per actor.
    """
    gen, res = spec.generation, spec.resources
    method = method_for(spec.compression)
    expected = method.expected_kv_tokens(spec)
    try:
        engine = Engine(
            loaded.model, config, decode_text=decode_text,
            prefill=None if loaded.full_prefill else loaded.prefill, reading_chunk=loaded.reading_chunk,
            kv_memory_gb=res.kv_memory_gb, kv_memory_fraction=res.kv_memory_fraction,
            slots=None if res.decode_slots == "auto" else res.decode_slots,
            expected_tokens=expected, compile=gen.compile, max_retries=res.max_retries,
            # A method's own wish (a small scorer reads many documents per pass) counts on
            # every backend; otherwise the backend's default (one request per group on CPU).
            group_rows=method.prefill_group_rows(spec),
            prefix_cache=spec.reuses_document_prefix,
        )
    except ValueError as e:
        raise ValueError(f"generate: the decode engine cannot run {gen.model!r} on {device}: {e}") from e
    engine.warm_up(greedy=gen.temperature <= 0.0)
    return engine


def _row_seed(seed: int, request_id: str) -> int:
    """Per-request seed: the same request samples the same way in any batch or rerun."""
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
