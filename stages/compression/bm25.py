"""Method ``bm25``: keep the chunks that share the most (rare) question tokens; no model.

The lexical retrieval baseline (Robertson & Zaragoza, 2009,
https://doi.org/10.1561/1500000019) next to ``rag``'s embeddings: the document is cut
into chunks of ``chunk_tokens`` generator tokens (as rag does), each chunk is scored
by BM25 against the query's token ids with the document's own chunks as the corpus
(bm25s, a maintained sparse-matrix implementation; a token in every chunk weighs
little), and the best chunks fill the budget, in document order
(stages/compression/chunks.py, which rag shares). No embedder, no GPU: it runs as its
own CPU actor pool before generate.

Contract: ``bm25_scores(chunks, query_ids, k1, b)`` -> one score per chunk (>= 0);
``bm25_result(doc_ids, query_ids, ...)`` -> a ``RetrievalResult`` whose ``context_ids`` are
``min(target_tokens, len(doc))`` ids (fewer by a character's other pieces where the budget
ends inside one), a subsequence of ``doc_ids``, with the
retrieval figures. The stage ranks against the
question (qa), else the instruction (``rag_query``), tokenized without special tokens,
and adds the context columns and the retrieval figures rag adds, BM25 scores in place
of cosine similarities (no embedder: ``embedder_truncated_chunks`` is not among them,
it stays null). Rows are never dropped, a row with ``error`` passes through, a row
that fails gets ``error = "bm25: ..."``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from schemas.compression import CompressionSpec
from schemas.rows import RetrievedRow
from schemas.spec import JobSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
from stages.compression.chunks import (
    RETRIEVAL_COLUMNS,
    RetrievalResult,
    scored_result,
    split_chunks,
)
from stages.compression.rag import rag_query
from stages.rows import batch_to_rows, fail, rows_to_batch
from stages.token_bytes import NO_EDGES, CharacterEdges


class Bm25Compression(CompressionSpec):
    """Keep the chunks with the best BM25 score for the question, in document order."""

    method: Literal["bm25"] = "bm25"
    target_tokens: int = Field(default=1024, ge=1, description="Exact context budget in tokens.")
    chunk_tokens: int = Field(default=128, ge=8, description="Chunk size in generator tokens.")
    # k1 is 0.5-3 in practice; far above it BM25 is plain term frequency (1000: a typo's bound).
    k1: float = Field(default=1.5, ge=0.0, le=1000.0, description="BM25 term-frequency saturation.")
    b: float = Field(default=0.75, ge=0.0, le=1.0, description="BM25 chunk-length normalisation.")


def bm25_scores(chunks: Sequence[Sequence[int]], query_ids: Sequence[int], k1: float, b: float) -> list[float]:
    """One BM25 score per chunk (>= 0) for the query's distinct token ids, the chunks as the
    corpus. bm25s's ``lucene`` variant (idf ``log(1 + (n - df + 0.5) / (df + 0.5))``, never
    negative) scaled by ``k1 + 1``: Robertson and Zaragoza's form, whose figures the rows'
    ``retrieval_*_score`` columns have always held. A query token counts once (bm25s counts
    a repeated one again)."""
    import bm25s  # here, not at the top: a method module imports light modules only

    query = [str(t) for t in dict.fromkeys(query_ids)]
    if not chunks or not query:
        return [0.0] * len(chunks)
    index = bm25s.BM25(method="lucene", k1=k1, b=b)
    index.index([[str(t) for t in c] for c in chunks], show_progress=False)
    return [float(x) * (k1 + 1) for x in index.get_scores(query)]


def bm25_result(
    doc_ids: Sequence[int], query_ids: Sequence[int], config: Bm25Compression, edges: CharacterEdges = NO_EDGES,
) -> RetrievalResult:
    """The kept context and its retrieval figures; a document that fits is kept whole, unranked.
    No cut splits a character (``edges``: the generator tokenizer's)."""
    if len(doc_ids) <= config.target_tokens:
        return RetrievalResult(list(doc_ids), [(0, len(doc_ids))], spans=[0, len(doc_ids)] if doc_ids else [])
    chunks = split_chunks(doc_ids, config.chunk_tokens, edges)
    scores = bm25_scores(chunks, query_ids, config.k1, config.b)
    return scored_result(chunks, scores, config.target_tokens, edges)


class Bm25Stage:
    """Callable class for ``map_batches`` (TokenizedRow -> RetrievedRow): one tokenizer per actor."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from stages.model_loading import load_tokenizer

        job = JobSpec.model_validate(spec)
        self.config: Bm25Compression = Bm25Method().config(job)
        self._traced: set[str] = set()  # exception types whose stack this stage logged (stages/rows.py)
        self.tokenizer = load_tokenizer(job.generation.model)
        self.edges = CharacterEdges.of(self.tokenizer)

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
                res = bm25_result(row["doc_ids"], query, self.config, self.edges)
                row["context_ids"], row["context_tokens"] = res.context_ids, len(res.context_ids)
                row["context_spans"] = res.spans
                row["compress_s"] = time.perf_counter() - t0
                figures = res.figures()
                row.update({c: figures[c] for c in Bm25Method.adds if c in figures})
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                fail(row, "bm25", e, traced=self._traced)
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
    fills_budget = True

    def stage_class(self) -> type:
        return Bm25Stage
