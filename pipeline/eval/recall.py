"""Evidence recall: did the answer-bearing sentence survive compression? (reader-independent)

Why: a small reader may fail on a context that holds the answer (distractors, layout),
or guess right without it. Recall measures the compression alone, from what the reader
was given, so methods can be ranked apart from the reader.

Contract:
- The evidence of a question is read from the eval set (pipeline/corpus/eval_records.py):
  the answer is a literal substring of the document (an inserted fact's answer is unique;
  a native question's answer is its occurrence nearest the record's ``depths`` entry, the
  first one when the record has none), and its
  answer-bearing sentence is ``eval_records.sentence_span`` around the answer's first character: from
  the previous sentence end (``.``, ``!`` or ``?`` then whitespace) or paragraph break to
  the next, surrounding whitespace stripped. A
  two-sentence fact's answer-bearing sentence is its last one (where the answer is).
- Character spans become document token positions through the generating model's
  tokenizer (``add_special_tokens=False``, as stages/tokenize.py encodes a document): a
  token belongs to a span when its characters overlap it. ``evidence_for`` checks that
  its token count equals the pipeline's ``doc_tokens``; a row where they differ scores None.
- What survived is the output row's ``kept_spans`` (schemas/output.py: flattened
  ``[start, end)`` document token positions; the kept text of a text method, the kept
  keys/values' positions of a KV method). Per row (``recall_figures``):
  ``evidence_recall`` 1.0 when every token of the answer-bearing sentence is kept, else 0.0;
  ``answer_recall`` the same for the answer's own tokens; ``evidence_share`` the share of
  the sentence's tokens kept. All None when the row has no ``kept_spans`` (a failed row,
  summary vectors, a method that does not report positions) or no evidence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.corpus.eval_records import sentence_span

RECALL_COLUMNS = ("evidence_recall", "answer_recall", "evidence_share")


@dataclass(frozen=True)
class Evidence:
    """One question's evidence in document token positions (half-open ranges)."""

    sentence: tuple[int, int]  # tokens of the answer-bearing sentence
    answer: tuple[int, int]  # tokens of the answer itself
    doc_tokens: int  # the document's length in the same tokenizer


EvidenceIndex = dict[tuple[str, str], Evidence]  # (doc_id, question) -> Evidence


def token_range(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Tokens whose characters overlap ``[start, end)``: a half-open token range.
    ``offsets``: per token, its ``(char start, char end)``. ValueError when none overlaps."""
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    if not hit:
        raise ValueError(f"no token covers characters [{start}, {end})")
    return hit[0], hit[-1] + 1


def evidence_of(text: str, answer: str, offsets: list[tuple[int, int]], depth: float | None = None) -> Evidence | None:
    """The evidence of one question (None when the answer is not in the text): the answer's
    occurrence nearest ``depth`` (its character offset / len(text)), else its first."""
    at = text.find(answer)
    if at < 0 or not answer:
        return None
    if isinstance(depth, (int, float)) and not isinstance(depth, bool):
        found, starts = at, []
        while found >= 0:
            starts.append(found)
            found = text.find(answer, found + 1)
        at = min(starts, key=lambda x: abs(x - depth * len(text)))
    s0, s1 = sentence_span(text, at)
    return Evidence(token_range(offsets, s0, s1), token_range(offsets, at, at + len(answer)), len(offsets))


def evidence_for(eval_set: str, tokenizer: Any) -> EvidenceIndex:
    """(doc_id, question) -> Evidence for every question of a QA eval set (JSONL with id,
    text, questions, answers; a question's first answer is its evidence)."""
    import fsspec

    index: EvidenceIndex = {}
    with fsspec.open(eval_set, "r", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            text = rec.get("text") or ""
            qs, ans = rec.get("questions") or [], rec.get("answers") or []
            qs, ans = ([qs] if isinstance(qs, str) else qs), ([ans] if isinstance(ans, str) else ans)
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            offsets = [tuple(o) for o in enc["offset_mapping"]]
            depths = rec.get("depths") if isinstance(rec.get("depths"), list) else []
            for i, (q, a) in enumerate(zip(qs, ans, strict=False)):
                first = a[0] if isinstance(a, list) and a else a
                depth = depths[i] if i < len(depths) else None
                ev = evidence_of(text, str(first), offsets, depth) if isinstance(first, str) else None
                if ev is not None:
                    index[(str(rec.get("id")), str(q))] = ev
    return index


def kept_count(kept_spans: list[int], lo: int, hi: int) -> int:
    """How many positions of ``[lo, hi)`` the flattened ``[start, end)`` pairs cover."""
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in zip(kept_spans[::2], kept_spans[1::2], strict=True))


def recall_figures(kept_spans: list[int] | None, evidence: Evidence | None,
                   doc_tokens: int | None) -> dict[str, float | None]:
    """The row's RECALL_COLUMNS (see the contract)."""
    if kept_spans is None or evidence is None or (doc_tokens is not None and doc_tokens != evidence.doc_tokens):
        return dict.fromkeys(RECALL_COLUMNS)
    spans = [int(x) for x in kept_spans]
    (s0, s1), (a0, a1) = evidence.sentence, evidence.answer
    sentence_kept = kept_count(spans, s0, s1)
    return {
        "evidence_recall": float(sentence_kept == s1 - s0),
        "answer_recall": float(kept_count(spans, a0, a1) == a1 - a0),
        "evidence_share": sentence_kept / (s1 - s0),
    }
