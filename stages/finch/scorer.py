"""A smaller model reads and selects for a larger generator: method select's ``scorer``.

Why: a night's cost is mostly the generator reading every document token. SpecPrefill
(Liu et al., ICML 2025) and its cross-family follow-up showed that a small model's
attention finds the tokens that matter for a large one; here the small model's
calibrated retrieval heads (and the embedder) choose whole sentences, and the
generator prefills only those.

Contract: ``load_scorer(job, config, dtype, device)`` loads the scorer model named by
``config.scorer`` and returns a ``Scorer``; ``Scorer.prefill(model, gen_tokenizer, parts,
boundaries, similarity)`` takes B generator prompts (``PromptParts`` in the generator's
tokens) and returns the generator's ``CompressedPrefill`` of
``prefix ; kept sentences ; query``, where:
- sentences are the generator's (spans.sentence_spans over its ids), so the kept
  context is whole generator tokens and its length never exceeds ``target_tokens``
  (the budget counts generator tokens; choose_sentences' cap, or less under the qa
  relevance floor);
- each sentence is decoded and re-encoded in the scorer's tokenizer, so the scorer reads
  the same text in its own tokens; its reading pass (prefill.read_document, reading
  chunk: once per document for all rows of the call) keeps
  ``target_tokens x scorer/generator tokens`` entries whose last-pass scores give each
  sentence its heads' evidence (fusion.head_evidence);
- the choice is fusion.choose_sentences over the generator's sentences with the heads'
  evidence fused with the embedder's similarity (evidence fused) or alone (heads),
  with the resolved floor, order and next-sentence rule; without a floor (summaries)
  the budget is then filled exactly with the head of the best sentence left out
  (``fill_budget``);
- a document within the budget is read whole without scoring; ``compress_s`` is the
  scorer's reading and the choice, shared equally by the rows of the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from schemas.spec import JobSpec
from stages.decoding.state import CompressedPrefill
from stages.finch.config import SelectCompression
from stages.finch.fusion import (
    Similarity,
    choose_sentences,
    fuse,
    head_evidence,
    similarity_evidence,
)
from stages.finch.spans import Boundaries, sentence_spans
from stages.prompting import PromptBuilder, PromptParts, query_text

Spans = list[tuple[int, int]]


@dataclass
class _ScorerDoc:
    """One document in the scorer's tokens: ids, and per generator sentence its span."""

    ids: list[int]
    spans: Spans


@dataclass
class Scorer:
    """The scorer model, its tokenizer and prompt builder, and the job's prompt texts."""

    model: Any
    tokenizer: Any
    config: SelectCompression  # resolved
    instruction: str
    qa: bool

    def __post_init__(self) -> None:
        self.prompts = PromptBuilder(self.tokenizer)
        self._same_vocab: dict[int, bool] = {}

    def _shares_vocabulary(self, gen_tokenizer) -> bool:
        """The generator's tokenizer maps every token as the scorer's does (checked once per
        tokenizer): its ids are then read as they are, with no decode and re-encode."""
        key = id(gen_tokenizer)
        if key not in self._same_vocab:
            self._same_vocab[key] = (type(gen_tokenizer) is type(self.tokenizer)
                                     and gen_tokenizer.get_vocab() == self.tokenizer.get_vocab())
        return self._same_vocab[key]

    def _document(self, gen_tokenizer, context_ids: list[int], spans: Spans) -> _ScorerDoc:
        """The generator's sentences in the scorer's tokens (decoded and encoded in one batch
        each, unless the two share a vocabulary)."""
        if self._shares_vocabulary(gen_tokenizer):
            return _ScorerDoc(list(context_ids), list(spans))
        texts = gen_tokenizer.batch_decode([context_ids[s:e] for s, e in spans])
        pieces = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        ids: list[int] = []
        out: Spans = []
        for piece in pieces:
            out.append((len(ids), len(ids) + len(piece)))
            ids.extend(piece)
        return _ScorerDoc(ids, out)

    @torch.inference_mode()
    def choose(self, gen_tokenizer, parts: list[PromptParts], boundaries: Boundaries,
               similarity: Similarity | None, on_chunk: Callable[[], None] | None = None) -> list[list[int]]:
        """Per row, the generator document indices kept, in the order they are read."""
        from stages.finch.prefill import _kept_scores, read_document

        cfg = self.config
        join = cfg.sentence_split == "prose"
        kept: list[list[int] | None] = [None] * len(parts)
        todo = []
        for r, p in enumerate(parts):
            if len(p.context_ids) <= cfg.target_tokens:
                kept[r] = list(range(len(p.context_ids)))
            else:
                todo.append(r)
        if not todo:
            return [k or [] for k in kept]
        docs: dict[tuple[int, ...], tuple[Spans, _ScorerDoc]] = {}
        spans_g, sparts, ratio = [], [], []
        for r in todo:
            p = parts[r]
            key = tuple(p.context_ids)
            if key not in docs:
                sp = sentence_spans(p.context_ids, boundaries, join_lines=join)
                docs[key] = (sp, self._document(gen_tokenizer, p.context_ids, sp))
            sp, doc = docs[key]
            spans_g.append(sp)
            question = query_text(gen_tokenizer, p.query_ids) if self.qa else None
            sparts.append(self.prompts.build(doc.ids, self.instruction, question))
            ratio.append(len(doc.ids) / max(1, len(p.context_ids)))
        # The scorer keeps as many of its tokens as the budget's share of the document.
        target = max(1, round(cfg.target_tokens * max(ratio)))
        read_cfg = cfg.model_copy(update={"target_tokens": target})
        pad = self.tokenizer.pad_token_id
        read = read_document(self.model, sparts, read_cfg, pad, on_chunk=on_chunk)
        scores = _kept_scores(read.doc_index0, read.kept_score, read.kept)
        del read
        views = similarity([parts[r] for r in todo], spans_g) if cfg.evidence == "fused" else None
        for j, r in enumerate(todo):
            doc = docs[tuple(parts[r].context_ids)][1]
            heads = head_evidence(doc.spans, scores[j])
            if views is not None:
                evidence = fuse(heads, similarity_evidence(views[j].cosine, views[j].content), cfg.similarity_weight)
                follows = views[j].follows if cfg.next_sentence else None
            else:
                evidence, follows = heads, None
            chosen = choose_sentences(spans_g[j], evidence, cfg.target_tokens, cfg.relevance_floor,
                                      cfg.order, follows)
            if cfg.relevance_floor == 0:
                chosen = fill_budget(chosen, spans_g[j], evidence, cfg.target_tokens)
            kept[r] = chosen
        return [k or [] for k in kept]

    def prefill(self, model, gen_tokenizer, parts: list[PromptParts], boundaries: Boundaries,
                similarity: Similarity | None, on_chunk: Callable[[], None] | None = None) -> CompressedPrefill:
        """The generator's prefill of each row's kept sentences (module contract)."""
        from stages.finch.prefill import _prefill_kept

        t0 = time.perf_counter()
        between = [0.0]  # the engine's decode steps run between chunks: not the scorer's time

        def timed_on_chunk() -> None:
            ts = time.perf_counter()
            on_chunk()  # type: ignore[misc]
            between[0] += time.perf_counter() - ts

        kept = self.choose(gen_tokenizer, parts, boundaries, similarity,
                           on_chunk=timed_on_chunk if on_chunk is not None else None)
        compress_s = time.perf_counter() - t0 - between[0]
        return _prefill_kept(model, parts, kept, gen_tokenizer.pad_token_id, t0, compress_s)


def fill_budget(kept: list[int], spans: Spans, evidence: list[float], budget: int) -> list[int]:
    """``kept`` (document indices in reading order) topped up to exactly ``budget`` with the
    head of the best-scored sentence not kept whole (whole sentences rarely add up to the
    budget; a summary's budget is meant to be read in full). The head goes where its
    sentence belongs: in document order among ascending ``kept``, first otherwise (least
    relevant first)."""
    room = budget - len(kept)
    if room <= 0:
        return kept
    have = set(kept)
    for i in sorted(range(len(spans)), key=lambda i: (-evidence[i], i)):
        rest = [j for j in range(*spans[i]) if j not in have]
        if rest:
            head = rest[:room]
            if kept == sorted(kept):
                return sorted(kept + head)
            return head + kept
    return kept


def load_scorer(job: JobSpec, config: SelectCompression, dtype: str, device: torch.device) -> Scorer:
    """The scorer of ``config`` (resolved; ``config.scorer`` set) on ``device``."""
    from stages.finch import check_supported
    from stages.model_loading import load_causal_lm

    assert config.scorer is not None
    model, tok = load_causal_lm(config.scorer, dtype, device)
    check_supported(model)
    return Scorer(model, tok, config, job.task.resolved_instruction, job.task.kind == "qa")
