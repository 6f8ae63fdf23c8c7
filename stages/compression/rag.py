"""Method ``rag``: keep the document chunks most similar to the query, in document order.

This is the retrieval baseline of the Finch paper (Corallo & Papotti, 2024,
https://arxiv.org/abs/2408.00167): the document is cut into consecutive chunks of
``chunk_tokens`` generator tokens, chunks and query are embedded with a
sentence-transformers model, and the most similar chunks (cosine similarity) fill
the budget. It runs as its own actor pool before generate (``RagStage``), so the
embedder scales on its own resources (``resources.compress_actors``,
``compress_num_gpus``).

Contract (Ray-agnostic core, ``rag_contexts``):
- Input per request: ``doc_ids`` (list[int], the whole document in generator
  tokens) and ``query`` (the question for qa, else the instruction: ``rag_query``).
- Output per request: ``context_ids`` whose length is exactly
  ``min(target_tokens, len(doc_ids))``. Chunks are taken best first; the last one
  taken is cut (its head kept) so the budget is filled exactly. Kept pieces are
  emitted in document order, so the result is a subsequence of ``doc_ids``.
- A document that fits the budget is kept whole without embedding anything.
- The embedder reads at most its own ``max_seq_length`` word pieces per chunk (256
  for all-MiniLM-L6-v2); the rest of a longer chunk does not count towards its
  score, though it is still kept. On jobs/eval the median is 0.98 MiniLM word pieces
  per SmolLM2 token, so about 40% of default 256-token chunks are scored on their
  first ~255 word pieces only; use chunk_tokens <= ~200 to score whole chunks.
- All chunks of all requests of a batch are embedded in one ``encode`` call, all
  queries in another. A request that fails yields its exception in place of a
  result; the others go on.

Stage (``RagStage``, rows of schemas/rows.TokenizedRow -> CompressedRow): adds
``context_ids``, ``context_tokens`` and ``compress_s`` (this row's own time plus its
share of the batch's embedding time). Rows whose ``error`` is set pass through
untouched (the three columns null); a row that fails here gets ``error = "rag: ..."``.
Rows are never dropped or reordered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import Field

from schemas.compression import CompressionSpec
from schemas.rows import CompressedRow, TokenizedRow
from schemas.spec import EMBEDDED_EMBEDDER, JobSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
from stages.rows import batch_to_rows, fail, rows_to_batch

if TYPE_CHECKING:
    import torch


class RagCompression(CompressionSpec):
    """Keep the chunks most similar to the question (or instruction), in document order."""

    method: Literal["rag"] = "rag"
    target_tokens: int = Field(default=1024, ge=1, description="Exact context budget in tokens.")
    chunk_tokens: int = Field(
        default=256, ge=8, description="Chunk size in generator tokens (the Finch paper used 256)."
    )
    embedder: str = Field(
        default=EMBEDDED_EMBEDDER,
        description="sentence-transformers model id or path; default is the embedded all-MiniLM-L6-v2.",
    )
    embed_batch_size: int = Field(default=64, ge=1, description="Chunks per embedding batch.")


class TextEmbedder(Protocol):
    """Embeds texts as L2-normalised vectors (so a dot product is cosine similarity)."""

    def embed_queries(self, texts: list[str]) -> torch.Tensor: ...  # [N, E]

    def embed_chunks(self, texts: list[str]) -> torch.Tensor: ...  # [N, E]


class SentenceEmbedder:
    """``TextEmbedder`` over a sentence-transformers model.

    Uses the model's query/document encoders where the installed
    sentence-transformers has them (models with retrieval prompts, e.g. e5, need
    them); for symmetric models such as all-MiniLM-L6-v2 both equal ``encode``.
    """

    def __init__(self, model: Any, batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"embed batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = batch_size

    def _encode(self, method: str, texts: list[str]) -> torch.Tensor:
        fn = getattr(self.model, method, None) or self.model.encode
        emb = fn(
            texts,
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return emb.detach().float().cpu()  # [N, E]

    def embed_queries(self, texts: list[str]) -> torch.Tensor:
        return self._encode("encode_query", texts)

    def embed_chunks(self, texts: list[str]) -> torch.Tensor:
        return self._encode("encode_document", texts)


def load_embedder(name: str, device: torch.device | str = "cpu", batch_size: int = 64) -> SentenceEmbedder:
    """Load a sentence-transformers model by id, path or the embedded sentinel name."""
    from sentence_transformers import SentenceTransformer

    from stages.model_loading import resolve_embedder

    return SentenceEmbedder(
        SentenceTransformer(resolve_embedder(name), device=str(device)), batch_size
    )


@dataclass
class RagResult:
    context_ids: list[int]
    kept: list[tuple[int, int]]  # (chunk index, tokens kept from its head), document order
    compress_s: float = 0.0
    n_chunks: int = 0


def split_chunks(doc_ids: Sequence[int], chunk_tokens: int) -> list[list[int]]:
    """Consecutive chunks of ``chunk_tokens`` ids; the last one may be shorter."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    ids = list(doc_ids)
    return [ids[i : i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]


def select_chunks(
    scores: Sequence[float], chunk_lens: Sequence[int], target_tokens: int
) -> list[tuple[int, int]]:
    """Pick chunks best score first until ``target_tokens`` is filled exactly.

    Returns ``(chunk index, tokens kept)`` in document order; the kept counts sum to
    ``min(target_tokens, sum(chunk_lens))``. Equal scores prefer the earlier chunk.
    """
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    assert len(scores) == len(chunk_lens), (len(scores), len(chunk_lens))
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    left = target_tokens
    kept: dict[int, int] = {}
    for i in order:
        if left <= 0:
            break
        take = min(chunk_lens[i], left)
        if take > 0:
            kept[i] = take
            left -= take
    return sorted(kept.items())


def assemble(chunks: Sequence[Sequence[int]], kept: Sequence[tuple[int, int]]) -> list[int]:
    """Concatenate the kept head of each selected chunk, in the order given."""
    out: list[int] = []
    for i, n in kept:
        out.extend(chunks[i][:n])
    return out


@dataclass
class _Pending:
    """A request that needs embedding: its chunks, their texts and its own timings."""

    index: int
    query: str
    chunks: list[list[int]]
    texts: list[str]
    local_s: float
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
    chunk_tokens: int,
) -> list[RagResult | BaseException]:
    """RAG-compress a batch of documents; see the module contract.

    ``compress_s`` of a result is its own split/decode/select time plus a share of
    the batch's embedding time proportional to the texts (chunks + query) it embedded.
    """
    if target_tokens < 1 or chunk_tokens < 1:
        raise ValueError(
            f"target_tokens and chunk_tokens must be >= 1, got {target_tokens}, {chunk_tokens}"
        )
    results: list[RagResult | BaseException | None] = [None] * len(docs)
    pending: list[_Pending] = []
    for i, (doc, query) in enumerate(zip(docs, queries, strict=True)):
        t0 = time.perf_counter()
        try:
            ids = _check_request(doc, query)
            chunks = split_chunks(ids, chunk_tokens)
            if len(ids) <= target_tokens:  # fits: nothing to choose
                kept = [(c, len(ch)) for c, ch in enumerate(chunks)]
                results[i] = RagResult(ids, kept, time.perf_counter() - t0, len(chunks))
                continue
            texts = tokenizer.batch_decode(chunks, skip_special_tokens=True)
            pending.append(_Pending(i, query, chunks, texts, time.perf_counter() - t0))
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
            kept = select_chunks(p.scores, [len(c) for c in p.chunks], target_tokens)
            context = assemble(p.chunks, kept)
            share = embed_s * (len(p.texts) + 1) / n_texts
            local = p.local_s + time.perf_counter() - t0
            results[p.index] = RagResult(context, kept, local + share, len(p.chunks))
    assert all(r is not None for r in results)
    return results


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
        self.device = pick_device(job.resources.compress_num_gpus)
        self.tokenizer = load_tokenizer(job.generation.model)
        self.embedder = load_embedder(self.config.embedder, self.device, batch_size=self.config.embed_batch_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows: list[CompressedRow] = batch_to_rows(batch)
        for r in rows:
            for col in CONTEXT_COLUMNS:
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
            )
            for row, res in zip(live, results, strict=True):
                if isinstance(res, RagResult):
                    row["context_ids"] = res.context_ids
                    row["context_tokens"] = len(res.context_ids)
                    row["compress_s"] = float(res.compress_s)
                else:
                    fail(row, "rag", res)
        return rows_to_batch(rows)


class RagMethod(CompressionMethod):
    name = "rag"
    spec_model = RagCompression
    summary = "the chunks most similar to the question, in document order"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 2
    runs_at = "text_stage"
    needs = ("doc_ids", "question", "instruction")
    adds = CONTEXT_COLUMNS
    uses_compress_gpus = True
    eval_budgeted = True

    def stage_class(self) -> type:
        return RagStage
