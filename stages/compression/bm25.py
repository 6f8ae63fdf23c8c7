"""Method ``bm25``: keep the chunks that share the most (rare) question tokens; no model.

The lexical retrieval baseline (Robertson & Zaragoza, 2009,
https://doi.org/10.1561/1500000019) next to ``rag``'s embeddings: the document is cut
into chunks of ``chunk_tokens`` generator tokens (as rag does), each chunk is scored
by BM25 against the query's token ids with the document's own chunks as the corpus
(a token in every chunk weighs nothing), and the best chunks fill the budget exactly,
in document order (``stages.compression.rag.select_chunks``/``assemble``). No
embedder, no GPU: it runs as its own CPU actor pool before generate.

Contract: ``bm25_scores(chunks, query_ids, k1, b)`` -> one score per chunk (>= 0);
``bm25_result(doc_ids, query_ids, ...)`` -> a ``RagResult`` whose ``context_ids`` are
exactly ``min(target_tokens, len(doc))`` ids, a subsequence of ``doc_ids``, with the
retrieval figures. The stage ranks against the
question (qa), else the instruction (``rag_query``), tokenized without special tokens,
and adds the context columns and the retrieval figures rag adds, BM25 scores in place
of cosine similarities (no embedder: ``embedder_truncated_chunks`` is not among them,
it stays null). Rows are never dropped, a row with ``error`` passes through, a row
that fails gets ``error = "bm25: ..."``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from schemas.compression import CompressionSpec
from schemas.rows import RetrievedRow
from schemas.spec import JobSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
from stages.compression.rag import (
    RETRIEVAL_COLUMNS,
    RagResult,
    rag_query,
    scored_result,
    split_chunks,
)
from stages.rows import batch_to_rows, fail, rows_to_batch


class Bm25Compression(CompressionSpec):
    """Keep the chunks with the best BM25 score for the question, in document order."""

    method: Literal["bm25"] = "bm25"
    target_tokens: int = Field(default=1024, ge=1, description="Exact context budget in tokens.")
    chunk_tokens: int = Field(default=128, ge=8, description="Chunk size in generator tokens.")
    # k1 is 0.5-3 in practice; far above it BM25 is plain term frequency (1000: a typo's bound).
    k1: float = Field(default=1.5, ge=0.0, le=1000.0, description="BM25 term-frequency saturation.")
    b: float = Field(default=0.75, ge=0.0, le=1.0, description="BM25 chunk-length normalisation.")


def bm25_scores(chunks: Sequence[Sequence[int]], query_ids: Sequence[int], k1: float, b: float) -> list[float]:
    """BM25 of each chunk for the query's distinct tokens, IDF over these chunks."""
    counts = [Counter(c) for c in chunks]
    n, avg = len(chunks), sum(map(len, chunks)) / max(1, len(chunks))
    scores = [0.0] * n
    for t in set(query_ids):
        df = sum(t in c for c in counts)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, (c, chunk) in enumerate(zip(counts, chunks, strict=True)):
            tf = c[t]
            if tf:
                scores[i] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(chunk) / avg))
    return scores


def bm25_result(doc_ids: Sequence[int], query_ids: Sequence[int], config: Bm25Compression) -> RagResult:
    """The kept context and its retrieval figures; a document that fits is kept whole, unranked."""
    if len(doc_ids) <= config.target_tokens:
        return RagResult(list(doc_ids), [(0, len(doc_ids))], spans=[0, len(doc_ids)] if doc_ids else [])
    chunks = split_chunks(doc_ids, config.chunk_tokens)
    return scored_result(chunks, bm25_scores(chunks, query_ids, config.k1, config.b), config.target_tokens)


class Bm25Stage:
    """Callable class for ``map_batches`` (TokenizedRow -> RetrievedRow): one tokenizer per actor."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from stages.model_loading import load_tokenizer

        job = JobSpec.model_validate(spec)
        self.config: Bm25Compression = Bm25Method().config(job)
        self.tokenizer = load_tokenizer(job.generation.model)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows: list[RetrievedRow] = batch_to_rows(batch)
        for row in rows:
            for col in Bm25Method.adds:
                row.setdefault(col, None)
            if row.get("error"):
                continue
            t0 = time.perf_counter()
            try:
                if row.get("doc_ids") is None:
                    raise ValueError("doc_ids is missing (the tokenize stage must run first)")
                query = self.tokenizer(rag_query(row) or "", add_special_tokens=False)["input_ids"]
                res = bm25_result(row["doc_ids"], query, self.config)
                row["context_ids"], row["context_tokens"] = res.context_ids, len(res.context_ids)
                row["context_spans"] = res.spans
                row["compress_s"] = time.perf_counter() - t0
                figures = res.figures()
                row.update({c: figures[c] for c in Bm25Method.adds if c in figures})
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                fail(row, "bm25", e)
        return rows_to_batch(rows)


class Bm25Method(CompressionMethod):
    name = "bm25"
    spec_model = Bm25Compression
    summary = "the chunks sharing the most (rare) question tokens, in document order (BM25, no model)"
    paper = "https://doi.org/10.1561/1500000019"
    order = 3  # after rag, before finch: a cheaper retrieval baseline
    runs_at = "text_stage"
    needs = ("doc_ids", "question", "instruction")
    adds = CONTEXT_COLUMNS + tuple(c for c in RETRIEVAL_COLUMNS if c != "embedder_truncated_chunks")
    eval_budgeted = True

    def stage_class(self) -> type:
        return Bm25Stage
