"""Relevance order for early exit's kept text (Finch ``order: relevance``).

Why: early exit re-reads the kept tokens as a fresh prompt, so their order is free.
Small models answer from what sits next to the question (recency); in document order
the evidence may sit hundreds of tokens before the question, behind fragments that
merely share words with it. LongLLMLingua (Jiang et al., 2023) reorders retrieved
documents by importance for the same reason. Here the kept text is cut into units
(runs of consecutive kept tokens, or the sentences they belong to), and the units
are laid out least relevant first, so the most relevant unit ends right before the
question. Each unit keeps its own tokens in document order.

Contract:
- ``kept_units(kept, spans)``: ascending document indices -> units (lists of
  ascending indices) that partition ``kept``: consecutive runs, or, with sentence
  ``spans`` ([start, end) tiling the document), the kept indices of each sentence.
- ``order_by_relevance(units, score)``: the units' indices flattened, units sorted by
  their best token score ascending (a token without a score counts -inf; ties keep
  document order). ``score`` maps a document index to the selection's final score.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping


def kept_units(kept: list[int], spans: list[tuple[int, int]] | None = None) -> list[list[int]]:
    """Group ascending ``kept`` into runs (no spans) or sentences (see the contract)."""
    units: list[list[int]] = []
    starts = [s for s, _ in spans] if spans else None
    last_key = None
    for j in kept:
        key = bisect.bisect_right(starts, j) - 1 if starts is not None else None
        same = (key == last_key) if starts is not None else (bool(units) and units[-1][-1] == j - 1)
        if units and same:
            units[-1].append(j)
        else:
            units.append([j])
        last_key = key
    return units


def order_by_relevance(units: list[list[int]], score: Mapping[int, float]) -> list[int]:
    """Units least relevant first (best token score), flattened; stable for ties."""
    best = [max((score.get(j, float("-inf")) for j in u), default=float("-inf")) for u in units]
    order = sorted(range(len(units)), key=lambda i: best[i])
    return [j for i in order for j in units[i]]
