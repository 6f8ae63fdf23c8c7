"""Tokenize stage: documents -> generator token ids (RequestRow -> TokenizedRow).

Ray: ``TokenizeStage`` is a callable class for ``map_batches`` (one tokenizer per
actor). It adds ``doc_ids``/``doc_tokens`` to every row, in the tokenizer the
compression method names (``CompressionMethod.tokenizer_source``: the generating
model's, or an AutoCompressor checkpoint's own). A method that runs at ``tokenize``
(a slice of the ids, e.g. truncate) rides along here rather than costing a pool: it
also adds ``context_ids``/``context_tokens``/``compress_s``/``context_spans`` (CompressedRow).
A document over ``input.max_doc_tokens`` becomes an error row of kind ``input``
(stages/read.doc_tokens_error). Rows with ``error`` pass through untouched; see
schemas/rows.py.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np

from schemas.output import INPUT
from schemas.rows import TOKENIZE_ADDS, TOKENIZE_NEEDS, CompressedRow, TokenizedRow
from schemas.spec import JobSpec
from stages.compression import method_for
from stages.compression.base import positions_of
from stages.context_budget import model_context, over_context
from stages.model_loading import load_tokenizer
from stages.prompting import PromptBuilder
from stages.read import doc_tokens_error
from stages.rows import batch_to_rows, fail, rows_to_batch
from stages.token_bytes import NO_EDGES


class TokenizeStage:
    needs: ClassVar[tuple[str, ...]] = TOKENIZE_NEEDS
    adds: ClassVar[tuple[str, ...]] = TOKENIZE_ADDS

    def __init__(self, spec: dict) -> None:
        self.spec = JobSpec.model_validate(spec)
        self._traced: set[str] = set()  # exception types whose stack this stage logged (stages/rows.py)
        self.method = method_for(self.spec.compression)
        self.tokenizer = load_tokenizer(self.method.tokenizer_source(self.spec))
        # Only a method that cuts ids here reads the tokenizer's edges (~0.15 s): what it asks for.
        self.edges = self.method.tokenizer_edges(self.tokenizer) if self.method.runs_at == "tokenize" else NO_EDGES
        # A method that prefills documents whole (none): a document over the model's context
        # fails here, at once, not after waiting for the generate stage (which checks again).
        self.context = model_context(self.spec.generation.model) if self.method.prefills_whole(self.spec) else None
        self.prompts = PromptBuilder(self.tokenizer) if self.context else None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def tokenize(self, row: TokenizedRow | CompressedRow) -> None:
        """Fill one row's columns in place (a row already failed is left as is)."""
        row.setdefault("doc_ids", None)
        row.setdefault("doc_tokens", None)
        if row.get("error"):
            return
        in_tokenize = self.method.runs_at == "tokenize"
        try:
            t0 = time.perf_counter()
            ids = self.encode(row["text"])
            too_long = doc_tokens_error(len(ids), self.spec.input, row.get("doc_id"))
            if too_long:  # final: the same document fails the same way on every rerun
                row["doc_tokens"] = len(ids)
                fail(row, "tokenize", too_long, kind=INPUT)
                return
            row["doc_ids"], row["doc_tokens"] = ids, len(ids)
            over = self._over_context(row, len(ids))
            if over:  # final, as above
                fail(row, "tokenize", over, kind=INPUT)
                return
            if in_tokenize:
                spans = self.method.compress_spans(self.spec.compression, ids, self.edges)
                ctx = [ids[p] for p in positions_of(spans)]
                row["context_ids"], row["context_tokens"], row["context_spans"] = ctx, len(ctx), spans
                row["compress_s"] = time.perf_counter() - t0
        except Exception as e:
            fail(row, "tokenize", e, traced=self._traced)

    def _over_context(self, row: TokenizedRow, n_tokens: int) -> str | None:
        if not self.context or self.prompts is None:
            return None
        need = n_tokens + self.prompts.overhead_tokens(row.get("instruction") or "", row.get("question"))
        return over_context(row.get("doc_id"), need, self.spec.generation.max_new_tokens, self.context)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows: list[TokenizedRow] = batch_to_rows(batch)
        for row in rows:
            self.tokenize(row)
        return rows_to_batch(rows)

