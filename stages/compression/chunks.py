"""Chunks of generator tokens, chosen by score to fill a budget: the retrieval methods'
shared core (``rag`` scores chunks with an embedder, ``bm25`` with BM25 over token ids).

Contract:
- ``split_chunks(doc_ids, chunk_tokens, edges)``: consecutive chunks tiling the document,
  each cut between characters (stages/token_bytes.py ``CharacterEdges``).
- ``select_chunks(scores, chunk_lens, target)``: ``(chunk index, tokens kept)`` best score
  first until the budget is filled exactly, in document order.
- ``scored_result(chunks, scores, target, edges)``: the kept context (the kept heads of the
  chosen chunks, in document order: a subsequence of the document), where it sits
  (``spans``) and the retrieval figures (``RETRIEVAL_COLUMNS``, schemas/output.py). Its
  length is ``min(target, len(doc))``, less the pieces of a character the budget's end
  fell in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stages.token_bytes import NO_EDGES, CharacterEdges

#: Retrieval figures a retrieval method adds (schemas/rows.RetrievedRow, schemas/output.py).
RETRIEVAL_COLUMNS = (
    "retrieval_chunks", "retrieved_chunks", "retrieval_top_score", "retrieval_mean_score",
    "embedder_truncated_chunks",
)  # fmt: skip


@dataclass
class RetrievalResult:
    """One request's context and retrieval figures (schemas/output.py RETRIEVAL columns)."""

    context_ids: list[int]
    kept: list[tuple[int, int]]  # (chunk index, tokens kept from its head), document order
    compress_s: float = 0.0
    n_chunks: int = 0  # chunks ranked; 0 when the document fit the budget
    top_score: float | None = None  # best chunk score; None when nothing was ranked
    mean_score: float | None = None  # mean score of the kept chunks
    truncated_chunks: int = 0  # ranked chunks longer than the embedder's window
    # where context_ids sit in the document: flattened [start, end) pairs (base.spans_of)
    spans: list[int] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The row's RETRIEVAL_COLUMNS."""
        vals = (self.n_chunks, len(self.kept) if self.n_chunks else 0, self.top_score,
                self.mean_score, self.truncated_chunks)  # fmt: skip
        return dict(zip(RETRIEVAL_COLUMNS, vals, strict=True))


def scored_result(
    chunks: Sequence[Sequence[int]], scores: Sequence[float], target_tokens: int,
    edges: CharacterEdges = NO_EDGES,
) -> RetrievalResult:
    """Select chunks by ``scores`` to fill ``target_tokens`` and report the figures. The last
    chunk taken, cut to fit, ends between characters (``edges``): the budget is filled
    exactly, or short by the pieces of the character its end fell in."""
    kept = select_chunks(scores, [len(c) for c in chunks], target_tokens)
    kept = [(i, edges.before(chunks[i], n)) for i, n in kept]
    kept = [(i, n) for i, n in kept if n]
    kept_scores = [float(scores[i]) for i, _ in kept]
    return RetrievalResult(
        assemble(chunks, kept), kept, n_chunks=len(chunks),
        top_score=max(map(float, scores)) if len(scores) else None,
        mean_score=sum(kept_scores) / len(kept_scores) if kept_scores else None,
        spans=kept_spans(chunks, kept),
    )  # fmt: skip


def kept_spans(chunks: Sequence[Sequence[int]], kept: Sequence[tuple[int, int]]) -> list[int]:
    """Where ``assemble(chunks, kept)`` sits in the document the consecutive ``chunks`` cut:
    flattened ``[start, end)`` pairs, adjacent pieces merged (base.spans_of)."""
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + len(c))
    out: list[int] = []
    for i, n in kept:
        if n <= 0:
            continue
        if out and out[-1] == starts[i]:
            out[-1] = starts[i] + n
        else:
            out += [starts[i], starts[i] + n]
    return out


def split_chunks(doc_ids: Sequence[int], chunk_tokens: int, edges: CharacterEdges = NO_EDGES) -> list[list[int]]:
    """Consecutive chunks of ``chunk_tokens`` ids (the last one may be shorter), each ending
    between characters (``edges``): a chunk whose end would split one ends before it, a
    few ids shorter (longer only if a single character outgrows the size)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    ids = list(doc_ids)
    out, start = [], 0
    while start < len(ids):
        end = edges.before(ids, min(start + chunk_tokens, len(ids)), start)
        if end == start:  # one character longer than the size: the chunk takes it whole
            end = edges.after(ids, min(start + chunk_tokens, len(ids)))
        out.append(ids[start:end])
        start = end
    return out


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
