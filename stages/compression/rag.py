"""Method ``rag``: keep the document chunks most similar to the query, in document order.

This is the retrieval baseline of the Finch paper (Corallo & Papotti, 2024,
https://arxiv.org/abs/2408.00167): the document is cut into consecutive chunks of
generator tokens, chunks and query are embedded with a sentence-transformers model,
and the most similar chunks (cosine similarity) fill the budget. It runs as its own
actor pool before generate (``RagStage``), so the embedder scales on its own
resources (``resources.compress_actors``, ``compress_num_gpus``).

Contract (Ray-agnostic core, ``rag_contexts``):
- Input per request: ``doc_ids`` (list[int], the whole document in generator
  tokens) and ``query`` (the question for qa, else the instruction: ``rag_query``).
- Output per request: ``context_ids`` whose length is exactly
  ``min(target_tokens, len(doc_ids))``. Chunks are taken best first; the last one
  taken is cut (its head kept) so the budget is filled exactly (short by a character's
  other pieces when its end falls inside one: no cut splits a character,
  stages/compression/chunks.py). Kept pieces are
  emitted in document order, so the result is a subsequence of ``doc_ids``; ``spans``
  says where (flattened ``[start, end)`` pairs, the row's ``context_spans``).
- A document that fits the budget is kept whole without embedding anything.
- Chunks fit the embedder's window (``chunk_document``): the embedder reads at most
  ``max_seq_length`` word pieces (256 for all-MiniLM-L6-v2, special tokens included)
  and silently cuts the rest. With ``chunk_tokens`` null (the default) the chunk size
  is derived per document from its measured word-piece/generator-token ratio so a
  chunk holds ``AUTO_WINDOW_FRACTION`` of the window, and any chunk that still
  overflows (code, tables) is halved until it fits: no chunk is ever cut. An explicit
  ``chunk_tokens`` is obeyed; its overflowing chunks are counted per row
  (``embedder_truncated_chunks``) and logged once per actor.
- All chunks of all requests of a batch are embedded in one ``encode`` call, all
  queries in another. A request that fails yields its exception in place of a
  result; the others go on.

Stage (``RagStage``, rows of schemas/rows.TokenizedRow -> RetrievedRow): adds
``context_ids``, ``context_tokens``, ``compress_s`` (this row's own time plus its
share of the batch's embedding time) and the retrieval figures ``RETRIEVAL_COLUMNS``
(defined in schemas/output.py). Rows whose ``error`` is set pass through untouched
(the added columns null); a row that fails here gets ``error = "rag: ..."``. Rows are
never dropped or reordered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import Field

from schemas.compression import CompressionSpec
from schemas.rows import RetrievedRow, TokenizedRow
from schemas.spec import EMBEDDED_EMBEDDER, JobSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
from stages.compression.chunks import (
    RETRIEVAL_COLUMNS,
    RetrievalResult,
    scored_result,
    split_chunks,
)
from stages.embedding import SentenceEmbedder, TextEmbedder, load_embedder
from stages.rows import batch_to_rows, fail, rows_to_batch
from stages.token_bytes import NO_EDGES, CharacterEdges

__all__ = ["SentenceEmbedder", "TextEmbedder", "load_embedder"]  # re-exported: rag's embedder

log = logging.getLogger(__name__)

#: Share of the embedder's window an auto-sized chunk aims at (~127 word pieces for
#: MiniLM, the length it was trained on). Chosen by measurement on jobs/eval (answer kept
#: in the context, 40 questions; jobs/results/rag_chunk_recall.md): chunks the embedder
#: cuts lose most (256 tokens: 0.70 at 512), chunks near the whole window lose some
#: (0.80), half the window and less are at par within a question or two.
AUTO_WINDOW_FRACTION = 0.5
#: Smallest chunk, in generator tokens, the auto size or a halving goes down to.
MIN_CHUNK_TOKENS = 8

class RagCompression(CompressionSpec):
    """Keep the chunks most similar to the question (or instruction), in document order."""

    method: Literal["rag"] = "rag"
    target_tokens: int = Field(default=1024, ge=1, description="Exact context budget in tokens.")
    chunk_tokens: int | None = Field(
        default=None,
        ge=8,
        description=(
            "Chunk size in generator tokens; null (default) = auto: as large as fits "
            f"{AUTO_WINDOW_FRACTION:g} of the embedder's window (max_seq_length word pieces), "
            "measured per document, so no chunk is cut by the embedder. A larger explicit "
            "size is scored on its head only (counted in embedder_truncated_chunks)."
        ),
    )
    embedder: str = Field(
        default=EMBEDDED_EMBEDDER,
        description="sentence-transformers model id or path; default is the embedded all-MiniLM-L6-v2.",
    )
    embed_batch_size: int = Field(default=64, ge=1, description="Chunks per embedding batch.")


def chunk_document(
    ids: Sequence[int],
    chunk_tokens: int | None,
    *,
    decode: Callable[[list[list[int]]], list[str]],
    count: Callable[[list[str]], list[int]],
    max_tokens: int,
    window_fraction: float = AUTO_WINDOW_FRACTION,
    edges: CharacterEdges = NO_EDGES,
) -> tuple[list[list[int]], list[str], int]:
    """Cut a document into chunks for an embedder reading ``max_tokens`` word pieces.

    ``decode``: generator ids -> text per chunk; ``count``: word pieces per text.
    Returns (chunks, their texts, how many exceed ``max_tokens``). ``chunk_tokens``
    None: size = ``window_fraction * max_tokens`` over the document's word-piece per
    generator-token ratio, and an overflowing chunk is halved until it fits (so the
    count returned is 0 unless a single token overflows). An explicit size is obeyed.
    Every cut falls between characters (``edges``, stages/compression/chunks.split_chunks).
    """
    if max_tokens < 1:
        raise ValueError(f"the embedder's window must hold >= 1 word piece, got {max_tokens}")
    ids = list(ids)
    if chunk_tokens is not None:
        chunks = split_chunks(ids, chunk_tokens, edges)
        texts = decode(chunks)
        return chunks, texts, sum(n > max_tokens for n in count(texts))
    ratio = max(1, count(decode([ids]))[0]) / max(1, len(ids))  # word pieces per token
    size = max(MIN_CHUNK_TOKENS, int(window_fraction * max_tokens / ratio))
    chunks = split_chunks(ids, size, edges)
    texts = decode(chunks)
    counts = count(texts)

    def middle(c: list[int]) -> int:  # a chunk's halving point, between characters
        return edges.before(c, len(c) // 2) or edges.after(c, len(c) // 2)

    while True:  # the ratio varies along a document (code, tables): halve what overflows
        over = {
            i: middle(c) for i, (c, n) in enumerate(zip(chunks, counts))
            if n > max_tokens and len(c) > MIN_CHUNK_TOKENS and 0 < middle(c) < len(c)
        }  # fmt: skip
        if not over:
            return chunks, texts, sum(n > max_tokens for n in counts)
        halves = [h for i in sorted(over) for h in (chunks[i][: over[i]], chunks[i][over[i] :])]
        h_texts = decode(halves)
        h_counts = count(h_texts)
        parts: list[tuple[list[int], str, int]] = []
        j = 0
        for i, triple in enumerate(zip(chunks, texts, counts)):
            if i in over:  # in place: chunks stay in document order
                parts += zip(halves[j : j + 2], h_texts[j : j + 2], h_counts[j : j + 2])
                j += 2
            else:
                parts.append(triple)
        chunks, texts, counts = (list(x) for x in zip(*parts))


@dataclass
class _Pending:
    """A request that needs embedding: its chunks, their texts and its own timings."""

    index: int
    query: str
    chunks: list[list[int]]
    texts: list[str]
    local_s: float
    truncated: int = 0  # chunks longer than the embedder's window
    scores: list[float] = field(default_factory=list)  # [n chunks] cosine similarity
    error: BaseException | None = None


def _check_request(doc_ids: Any, query: Any) -> list[int]:
    if doc_ids is None:
        raise ValueError("doc_ids is missing (the tokenize stage must run first)")
    ids = [int(t) for t in doc_ids]
    if any(t < 0 for t in ids):
        raise ValueError("doc_ids holds negative token ids")
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    return ids


def rag_contexts(
    docs: Sequence[Sequence[int] | None],
    queries: Sequence[str | None],
    *,
    tokenizer: Any,
    embedder: TextEmbedder,
    target_tokens: int,
    chunk_tokens: int | None = None,
    window_fraction: float = AUTO_WINDOW_FRACTION,
    edges: CharacterEdges | None = None,
) -> list[RetrievalResult | BaseException]:
    """RAG-compress a batch of documents; see the module contract.

    ``chunk_tokens`` None: auto-sized chunks that fit the embedder (``chunk_document``).
    ``edges``: ``tokenizer``'s character edges (a stage passes the ones it keeps; None
    reads them now).
    ``compress_s`` of a result is its own chunk/decode/select time plus a share of
    the batch's embedding time proportional to the texts (chunks + query) it embedded.
    """
    if target_tokens < 1 or (chunk_tokens is not None and chunk_tokens < 1):
        raise ValueError(
            f"target_tokens and chunk_tokens must be >= 1, got {target_tokens}, {chunk_tokens}"
        )

    def decode(chunks: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(chunks, skip_special_tokens=True)

    edges = CharacterEdges.of(tokenizer) if edges is None else edges

    results: list[RetrievalResult | BaseException | None] = [None] * len(docs)
    pending: list[_Pending] = []
    for i, (doc, query) in enumerate(zip(docs, queries, strict=True)):
        t0 = time.perf_counter()
        try:
            ids = _check_request(doc, query)
            if len(ids) <= target_tokens:  # fits: nothing to choose, nothing ranked
                results[i] = RetrievalResult(ids, [(0, len(ids))], time.perf_counter() - t0, spans=[0, len(ids)])
                continue
            chunks, texts, truncated = chunk_document(
                ids, chunk_tokens, decode=decode, count=embedder.count_tokens,
                max_tokens=embedder.max_tokens, window_fraction=window_fraction, edges=edges,
            )  # fmt: skip
            pending.append(_Pending(i, query, chunks, texts, time.perf_counter() - t0, truncated))
        except Exception as e:  # noqa: BLE001 - a bad request fails alone
            results[i] = e
    if pending:
        embed_s = _score(pending, embedder)
        n_texts = sum(len(p.texts) + 1 for p in pending)
        for p in pending:
            if p.error is not None:
                results[p.index] = p.error
                continue
            t0 = time.perf_counter()
            res = scored_result(p.chunks, p.scores, target_tokens, edges)
            share = embed_s * (len(p.texts) + 1) / n_texts
            res.compress_s = p.local_s + time.perf_counter() - t0 + share
            res.truncated_chunks = p.truncated
            results[p.index] = res
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def _score(pending: list[_Pending], embedder: TextEmbedder) -> float:
    """Fill each pending request's chunk scores; return the embedding wall time.

    One call embeds every query, one every chunk of every request. If a batched
    call fails, requests are embedded one by one so only the bad one fails (its
    ``error`` is set).
    """
    t0 = time.perf_counter()
    try:
        q = embedder.embed_queries([p.query for p in pending])  # [R, E]
        c = embedder.embed_chunks([t for p in pending for t in p.texts])  # [sum chunks, E]
        start = 0
        for r, p in enumerate(pending):
            stop = start + len(p.texts)
            p.scores = (c[start:stop] @ q[r]).tolist()  # cosine: both L2-normalised
            start = stop
    except Exception:  # noqa: BLE001 - isolate the failing request below
        for p in pending:
            try:
                q1 = embedder.embed_queries([p.query])[0]  # [E]
                p.scores = (embedder.embed_chunks(p.texts) @ q1).tolist()
            except Exception as e:  # noqa: BLE001
                p.error = e
    return time.perf_counter() - t0


def rag_query(row: TokenizedRow) -> str | None:
    """The text chunks are ranked against: the question (qa), else the instruction."""
    q = row.get("question")
    return q if isinstance(q, str) and q.strip() else row.get("instruction")


class RagStage:
    """Callable class for ``map_batches``: loads tokenizer and embedder once per actor."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from stages.model_loading import load_tokenizer, pick_device

        job = JobSpec.model_validate(spec)
        self.config: RagCompression = RagMethod().config(job)
        self._traced: set[str] = set()  # exception types whose stack this stage logged (stages/rows.py)
        self.device = pick_device(job.resources.compress_num_gpus)
        self.tokenizer = load_tokenizer(job.generation.model)
        self.edges = CharacterEdges.of(self.tokenizer)
        self.embedder = load_embedder(self.config.embedder, self.device, batch_size=self.config.embed_batch_size)
        self._warned = False

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows: list[RetrievedRow] = batch_to_rows(batch)
        for r in rows:
            for col in RagMethod.adds:
                r.setdefault(col, None)
        live = [r for r in rows if not r.get("error")]
        if live:
            results = rag_contexts(
                [r.get("doc_ids") for r in live],
                [rag_query(r) for r in live],
                tokenizer=self.tokenizer,
                embedder=self.embedder,
                target_tokens=self.config.target_tokens,
                chunk_tokens=self.config.chunk_tokens,
                edges=self.edges,
            )
            for row, res in zip(live, results, strict=True):
                if isinstance(res, RetrievalResult):
                    row["context_ids"] = res.context_ids
                    row["context_tokens"] = len(res.context_ids)
                    row["context_spans"] = res.spans
                    row["compress_s"] = float(res.compress_s)
                    row.update(res.figures())  # type: ignore[typeddict-item]
                    self._warn_truncated(res)
                else:
                    fail(row, "rag", res, traced=self._traced)
        return rows_to_batch(rows)

    def _warn_truncated(self, res: RetrievalResult) -> None:
        """Say once per actor that an explicit chunk_tokens overflows the embedder."""
        if res.truncated_chunks and not self._warned:
            self._warned = True
            log.warning(
                "rag: chunk_tokens %s overflows the embedder's window of %d word pieces: "
                "%d of %d chunks are scored on their head only (embedder_truncated_chunks); "
                "leave chunk_tokens unset to size chunks to the embedder",
                self.config.chunk_tokens, self.embedder.max_tokens, res.truncated_chunks, res.n_chunks,
            )  # fmt: skip


class RagMethod(CompressionMethod):
    name = "rag"
    spec_model = RagCompression
    summary = "the chunks (sized to fit the embedder) most similar to the question or instruction, in document order"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 2
    runs_at = "text_stage"
    needs = ("doc_ids", "question", "instruction")
    adds = CONTEXT_COLUMNS + RETRIEVAL_COLUMNS
    uses_compress_gpus = True
    eval_budgeted = True
    fills_budget = True

    def stage_class(self) -> type:
        return RagStage
