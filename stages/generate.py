"""Generate stage: compressed context -> answer/summary, one output row per request.

Ray: ``GenerateStage`` is the callable class of the generate actor pool. ``__init__``
loads the model once per actor; ``__call__`` turns a batch of request rows (see
stages/rows.py) into a batch of output rows (schemas/output.py), generating for the
whole batch at once. Two engines (``generation.engine``; auto picks by device):
- dynamic (CPU default): one padded prefill of the batch, one batched decode
  (stages/decoding/engine.py, growable cache, measured CPU kernel plan);
- static (GPU default): continuous batching over preallocated KV slots with
  compiled steps (stages/decoding/slot_engine.py): ``resources.decode_slots`` rows
  decode together and each finished row's slot is refilled with the batch's next
  request (prefilled by the compression method), so the batch may be larger than
  the decode batch and the GPU keeps decoding full batches.

Prefill strategies (DESIGN.md: they need the generating model's weights, so they run
here) come from the compression method (stages/compression/, ``CompressionMethod.load``):
a full prefill of the (possibly text-compressed) context by default, Finch's chunked
KV-cache compression, AutoCompressor summary vectors as a soft prompt, ... All hand a
PrefillState to the same decoder, configured by ``decode_config_for`` (one place).
Prompt lookup always searches the ORIGINAL document tokens + prompt + output so far,
whatever the prefill kept.

Failure contract: a row that cannot be generated becomes a row with ``error`` set. A
batch that raises is retried row by row, each row up to ``resources.max_retries``
more times, so one bad request never takes its batch mates down with it.
"""

from __future__ import annotations

import hashlib
import logging
import time

import numpy as np
import torch

from schemas import output as out_schema
from schemas.rows import GenerateInput, OutputRow, columns
from schemas.spec import JobSpec
from stages.compression import budgeted_names, method_for
from stages.compression.base import CONTEXT_COLUMNS, Prefill
from stages.decoding.config import RowResult, decode_config_for
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.slot_engine import SlotEngine
from stages.decoding.stops import cut_text
from stages.model_loading import pick_device
from stages.prompting import PromptBuilder
from stages.rows import batch_to_rows, rows_to_batch

log = logging.getLogger(__name__)


class GenerateStage:
    """TokenizedRow | CompressedRow batches -> OutputRow batches (schemas/rows.py)."""

    needs: tuple[str, ...] = ("request_id", "doc_ids", "instruction", "question", "error")
    adds: tuple[str, ...] = columns(OutputRow)

    def __init__(self, spec: dict) -> None:
        self.spec = JobSpec.model_validate(spec)
        gen, res = self.spec.generation, self.spec.resources
        self.device = pick_device(res.num_gpus)
        if self.device.type == "cpu":
            # One actor per node slice: use the CPUs Ray granted it, not every core.
            torch.set_num_threads(max(1, int(res.num_cpus)))
        self.method = method_for(self.spec.compression)
        loaded = self.method.load(self.spec, self.device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self._prefill: Prefill = loaded.prefill
        # Output columns a text method adds beyond its context (e.g. rag's retrieval
        # figures) are copied as they are; context_tokens/compress_s are combined below.
        self._carried = tuple(
            c for c in self.method.adds if c in out_schema.OUTPUT_COLUMNS and c not in CONTEXT_COLUMNS
        )
        # The engine's per-actor state: made (and its backend warmed up: the CPU kernel
        # plan measured or read) now, so the first batch's latency figures do not
        # include it; it learns step cost and acceptance across batches.
        self.slot_engine = make_slot_engine(self.spec, self.model, self.device)
        self.engine = EngineState(self.model, self.device) if self.slot_engine is None else None
        self.prompts = PromptBuilder(self.tokenizer)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.device_name = (
            f"cuda:{torch.cuda.get_device_name(self.device)}" if self.device.type == "cuda" else "cpu"
        )
        self.decode_config = decode_config_for(gen, self.tokenizer, self.model.generation_config)

    # ------------------------------------------------------------------ batches
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
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
        for i, result in self._generate_with_retries([rows[i] for i in todo], todo):
            outputs[i] = result
        wall = time.perf_counter() - t0
        per_row = wall / max(1, len(rows))
        for o in outputs:
            assert o is not None
            o["device"] = self.device_name
            o["device_s"] = per_row
            o["cost_usd"] = out_schema.cost_usd(per_row, self.spec.cost.usd_per_device_hour)
        return rows_to_batch(outputs)  # type: ignore[arg-type]

    def _precheck(self, row: GenerateInput) -> str | None:
        """Reject requests that cannot fit the model, before they cost a forward pass."""
        if self.method.reads_any_length:
            return None  # e.g. finch, autocompressor: they read the document chunk by chunk
        ctx = row.get("context_ids") or row.get("doc_ids") or []
        need = len(ctx) + self.prompts.overhead_tokens(row["instruction"], row.get("question"))
        if self.max_context and need + self.spec.generation.max_new_tokens > self.max_context:
            return (
                f"generate: document {row['doc_id']!r} needs {need} prompt tokens + "
                f"{self.spec.generation.max_new_tokens} new tokens, more than the model's "
                f"context of {self.max_context}; use compression.method {_one_of(budgeted_names())}"
            )
        return None

    def _generate_with_retries(
        self, rows: list[GenerateInput], idx: list[int]
    ) -> list[tuple[int, OutputRow]]:
        if not rows:
            return []
        try:
            return list(zip(idx, self._generate(rows)))
        except Exception as batch_err:  # fall back to one row at a time
            if len(rows) == 1:
                first_err: Exception | None = batch_err
                attempts = self.spec.resources.max_retries
            else:
                first_err, attempts = None, self.spec.resources.max_retries + 1
        results: list[tuple[int, OutputRow]] = []
        for i, row in zip(idx, rows):
            err = first_err
            for _ in range(attempts):
                try:
                    results.append((i, self._generate([row])[0]))
                    err = None
                    break
                except Exception as e:  # noqa: PERF203 - retries are the point
                    err = e
            if err is not None:
                msg = f"generate: {type(err).__name__}: {err}"
                kind = out_schema.classify_error(err)  # unknown exceptions: retryable
                results.append((i, self._output_row(row, None, error=msg, error_kind=kind)))
        return results

    def _generate(self, rows: list[GenerateInput]) -> list[OutputRow]:
        if self.slot_engine is not None:
            return self._generate_slots(rows)
        parts = self._prompt_parts(rows)
        compressed = self._prefill(parts)
        lookup, seeds = self._lookups_and_seeds(parts, rows)
        results = decode(
            self.engine, compressed.state, lookup, self.decode_config, seeds=seeds, decode_text=self._decode_text,
        )
        return [
            self._success_row(
                row, res, parts[b], compressed.context_tokens[b], compressed.compress_s[b], compressed.state.prefill_s
            )
            for b, (row, res) in enumerate(zip(rows, results))
        ]

    def _generate_slots(self, rows: list[GenerateInput]) -> list[OutputRow]:
        """Continuous batching on the static engine: the batch's requests stream through its slots.

        Each group of newcomers is prefilled by the compression method when slots free
        up; a request whose prefill fails becomes an error row, the others go on.
        """
        parts = self._prompt_parts(rows)
        done: dict[int, tuple[int, float, float]] = {}  # request -> (context tokens, compress s, prefill s)

        def prefill(idx: list[int]):
            compressed = self._prefill([parts[i] for i in idx])
            for j, i in enumerate(idx):
                done[i] = (compressed.context_tokens[j], compressed.compress_s[j], compressed.state.prefill_s)
            return compressed.state

        lookup, seeds = self._lookups_and_seeds(parts, rows)
        results, errors = self.slot_engine.run(lookup, seeds, prefill, self.decode_config, self._decode_text)
        outs: list[OutputRow] = []
        for i, (row, res, err) in enumerate(zip(rows, results, errors)):
            if res is None:
                err = err or RuntimeError("the engine returned no result")
                msg = f"generate: {type(err).__name__}: {err}"
                outs.append(self._output_row(row, None, error=msg, error_kind=out_schema.classify_error(err)))
            else:
                outs.append(self._success_row(row, res, parts[i], *done[i]))
        return outs

    def _prompt_parts(self, rows: list[GenerateInput]) -> list:
        """The chat prompt of each row around its (possibly text-compressed) context."""
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

    def _success_row(
        self, row: GenerateInput, res: RowResult, part, context_tokens: int, compress_s: float, prefill_s: float
    ) -> OutputRow:
        prompt_tokens = len(part.prefix_ids) + context_tokens + len(part.query_ids)
        return self._output_row(
            row, res, context_tokens=context_tokens, prompt_tokens=prompt_tokens,
            extra_compress_s=compress_s, prefill_s=prefill_s,
        )

    def _decode_text(self, tokens: list[int]) -> str:
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
        text_compress_s = float(row.get("compress_s") or 0.0)
        return out_schema.output_row(
            self.spec,
            row,
            error=error,
            error_kind=error_kind,
            context_tokens=context_tokens,
            compression_ratio=out_schema.compression_ratio(row.get("doc_tokens") or 0, context_tokens or 0),
            prompt_tokens=prompt_tokens,
            output_text=cut_text(self._decode_text(res.tokens), self.decode_config.stop_strings),
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
            **{c: row.get(c) for c in self._carried},
        )


def make_slot_engine(spec: JobSpec, model: torch.nn.Module, device: torch.device) -> SlotEngine | None:
    """The static engine the spec asks for (``generation.engine``), or None for the dynamic one.

    auto: static on CUDA when the model allows it (full attention everywhere, a plain
    output projection), else dynamic; static: always (a model that cannot use it is a
    clear error at actor start). Compiled steps are warmed up here, once per actor.
    """
    gen, res = spec.generation, spec.resources
    if gen.engine == "dynamic" or (gen.engine == "auto" and device.type != "cuda"):
        return None
    spec_drafts = gen.speculative.num_draft_tokens if gen.speculative.method == "prompt_lookup" else 0
    try:
        engine = SlotEngine(
            model, slots=res.decode_slots or res.batch_size, max_drafts=spec_drafts, compile=gen.compile
        )
    except ValueError as e:
        if gen.engine == "static":
            raise ValueError(f"generation.engine static: {e}; allowed for this model: dynamic or auto") from e
        log.warning("static decode engine unavailable for %s (%s); using the dynamic engine", gen.model, e)
        return None
    if engine.step.compiled:
        engine.warm_up(greedy=gen.temperature <= 0.0, max_drafts=spec_drafts)
    log.info("decode engine: %s", engine.describe())
    return engine


def _one_of(names: tuple[str, ...]) -> str:
    """'a, b or c'."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def _row_seed(seed: int, request_id: str) -> int:
    """Per-request seed: the same request samples the same way in any batch or rerun."""
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
