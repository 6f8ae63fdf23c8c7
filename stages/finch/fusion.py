"""Fused sentence evidence for Finch's early exit: the heads' attention and the meaning.

Why: the calibrated retrieval heads follow the question's words. When the question
repeats the answer sentence's words they find it; when it asks the same thing in other
words ("What gift do people joining the Lagos team receive?" for "Every new hire at the
Lagos branch is handed a copper kettle") they point at sentences that share words,
not meaning. A sentence embedder (the RAG method's MiniLM by default) scores meaning.
Early exit re-reads the kept text from its token ids, so the text it reads can be
chosen per sentence from both kinds of evidence after the chunked pass.

Contract (per row; sentences are ``spans``, [start, end) token ranges that tile the
document, from spans.sentence_spans):
- ``head_evidence(spans, score)``: per sentence, the best last-pass score among its
  kept tokens (``score``: document index -> score, the chunked pass's kept tokens),
  divided by the best sentence's; 0 for a sentence with no kept token. In [0, 1].
- ``similarity_evidence(cosine, content)``: per sentence, its cosine to the question
  relative to the document: ``(cos - median) / (max - median)`` clipped to [0, 1], the
  median and max over the sentences with ``content`` (blank sentences score 0). A
  document where every sentence scores the same gives 0 everywhere.
- ``sentence_cosines(embedder, tokenizer, docs, spans, questions)``: per row a
  ``SentenceView``: [S] cosines between the question and each sentence's decoded text
  (``embedder``: a stages.embedding.TextEmbedder), which sentences have content
  (non-blank text), and which go on the paragraph of the sentence before them (no
  blank line between: ``follows``). A document shared by several rows is embedded once.
- ``make_similarity(embedder, tokenizer)``: the ``Similarity`` finch_prefill takes:
  (prompts, their sentence spans) -> ``sentence_cosines`` with each prompt's question
  (prompting.query_text) as the query.
- ``fuse(heads, similarity, weight)``: ``(1 - weight) * heads + weight * similarity``.
- ``choose_sentences(spans, fused, budget, min_relevance, order, follows=None)``: the
  document indices the model reads: the sentences scoring at least ``min_relevance`` x
  the best (all of them at 0), best first, each taken whole while it fits ``budget``
  tokens (one that does not fit is skipped, a shorter one may follow). With
  ``follows``, each taken sentence brings the next one along when that one goes on the
  same paragraph and fits (an answer often sits in the sentence after the one that
  names its subject). Laid out in document order, or for ``order="relevance"`` least
  relevant first (a sentence and the one it brought stay together, in document order),
  so the best sentence ends next to the question. Never empty for a non-empty document
  and budget >= 1: when no sentence fits, the best sentence's first ``budget`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from stages.prompting import PromptParts, query_text

if TYPE_CHECKING:
    from stages.embedding import TextEmbedder

Spans = list[tuple[int, int]]


@dataclass(frozen=True)
class SentenceView:
    """One row's sentences as the embedder saw them: cosine [S] to the question, content
    [S] (non-blank), follows [S] (goes on the paragraph of the sentence before)."""

    cosine: torch.Tensor
    content: list[bool]
    follows: list[bool]


#: (prompts, each prompt's sentence spans) -> one SentenceView per prompt.
Similarity = Callable[[list[PromptParts], list[Spans]], list[SentenceView]]


def paragraph_follows(texts: Sequence[str]) -> list[bool]:
    """Per sentence (raw decoded text), whether it goes on the previous sentence's paragraph:
    no blank line in the whitespace between their contents, and both have content."""
    out = [False] * len(texts)
    for i in range(1, len(texts)):
        if not texts[i].strip() or not texts[i - 1].strip():
            continue
        prev = texts[i - 1]
        gap = prev[len(prev.rstrip()) :] + texts[i][: len(texts[i]) - len(texts[i].lstrip())]
        out[i] = gap.count("\n") <= 1
    return out


def head_evidence(spans: Sequence[tuple[int, int]], score: Mapping[int, float]) -> list[float]:
    """Best kept-token score per sentence, over the best sentence's (see the contract)."""
    best = [max((score[j] for j in range(s, e) if j in score), default=0.0) for s, e in spans]
    top = max(best, default=0.0)
    return [max(b, 0.0) / top if top > 0 else 0.0 for b in best]


def similarity_evidence(cosine: torch.Tensor, content: Sequence[bool]) -> list[float]:
    """Cosine relative to the document's median and best sentence (see the contract).

    cosine: [S] float, one per sentence; content: [S] bool.
    """
    mask = torch.tensor(list(content), dtype=torch.bool)
    if cosine.shape[0] != mask.shape[0]:
        raise ValueError(f"{cosine.shape[0]} cosines for {mask.shape[0]} sentences")
    if not bool(mask.any()):
        return [0.0] * len(content)
    vals = cosine.float()[mask]
    med, top = float(vals.median()), float(vals.max())
    if top <= med:
        return [0.0] * len(content)
    rel = ((cosine.float() - med) / (top - med)).clamp(0.0, 1.0) * mask
    return rel.tolist()


def sentence_cosines(
    embedder: TextEmbedder,
    tokenizer: Any,
    docs: Sequence[Sequence[int]],
    spans: Sequence[Sequence[tuple[int, int]]],
    questions: Sequence[str],
) -> list[SentenceView]:
    """Per row, the SentenceView of its sentences against its question."""
    texts: dict[tuple[int, ...], list[str]] = {}
    follows: dict[tuple[int, ...], list[bool]] = {}
    for ids, sp in zip(docs, spans, strict=True):
        key = tuple(ids)
        if key not in texts:
            raw = [tokenizer.decode(list(ids[s:e])) for s, e in sp]
            texts[key] = [t.strip() for t in raw]
            follows[key] = paragraph_follows(raw)
    flat = [t for ts in texts.values() for t in ts if t]
    vectors = embedder.embed_chunks(flat) if flat else torch.zeros(0, 1)  # [N, E]
    at: dict[tuple[int, ...], torch.Tensor] = {}
    k = 0
    for key, ts in texts.items():
        n = sum(1 for t in ts if t)
        at[key] = vectors[k : k + n]
        k += n
    q = embedder.embed_queries(list(questions))  # [B, E]
    out = []
    for row, ids in enumerate(docs):
        ts = texts[tuple(ids)]
        content = [bool(t) for t in ts]
        cos = torch.zeros(len(ts))
        if any(content):
            cos[torch.tensor(content)] = at[tuple(ids)] @ q[row]
        out.append(SentenceView(cos, content, follows[tuple(ids)]))
    return out


def make_similarity(embedder: TextEmbedder, tokenizer: Any) -> Similarity:
    """The Similarity of ``embedder`` over ``tokenizer``'s prompts (see the contract)."""

    def similarity(parts: list[PromptParts], spans: list[Spans]) -> list[SentenceView]:
        questions = [query_text(tokenizer, p.query_ids) for p in parts]
        return sentence_cosines(embedder, tokenizer, [p.context_ids for p in parts], spans, questions)

    return similarity


def fuse(heads: Sequence[float], similarity: Sequence[float], weight: float) -> list[float]:
    """(1 - weight) x heads + weight x similarity, per sentence."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"similarity weight must be in [0, 1], got {weight}")
    if len(heads) != len(similarity):
        raise ValueError(f"{len(heads)} head scores for {len(similarity)} similarities")
    return [(1 - weight) * h + weight * s for h, s in zip(heads, similarity, strict=True)]


def choose_sentences(
    spans: Sequence[tuple[int, int]],
    fused: Sequence[float],
    budget: int,
    min_relevance: float,
    order: str,
    follows: Sequence[bool] | None = None,
) -> list[int]:
    """The document indices read after early exit (see the module contract)."""
    if not spans or budget < 1:
        return []
    ranked = sorted(range(len(spans)), key=lambda i: (-fused[i], i))
    top = fused[ranked[0]]
    floor = min_relevance * top if top > 0 else float("-inf")
    size = [e - s for s, e in spans]
    units: list[list[int]] = []  # each: a chosen sentence, then the one it brought along
    taken: set[int] = set()
    used = 0
    for i in ranked:
        if fused[i] < floor:
            break
        if i in taken or used + size[i] > budget:
            continue
        unit = [i]
        used += size[i]
        nxt = i + 1
        if follows is not None and nxt < len(spans) and follows[nxt] and nxt not in taken \
                and used + size[nxt] <= budget:
            unit.append(nxt)
            used += size[nxt]
        taken.update(unit)
        units.append(unit)
    if not units:  # not even the best sentence fits: its head
        s, e = spans[ranked[0]]
        return list(range(s, min(e, s + budget)))
    if order == "relevance":
        units.sort(key=lambda u: (fused[u[0]], u[0]))  # least relevant first, best last
    else:
        units = [[i] for i in sorted(taken)]
    return [j for u in units for i in u for j in range(*spans[i])]
