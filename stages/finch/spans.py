"""Whole sentences from a token selection (Finch ``keep: sentences``, early-exit mode).

Why: the question's retrieval heads attend to the tokens that MATCH the question
("the first prize at the Valparaiso hackathon"), and pooling keeps their
neighbourhood; the answer often sits just after them ("... was a brass telescope")
and falls outside the kept window. Keeping whole sentences around what the heads
chose keeps the answer with its cue, and gives the model whole sentences to read.

Contract:
- ``boundary_token_ids(tokenizer)``: ids whose text ends a sentence (contains a
  newline, or ends in ``.``, ``!`` or ``?`` once trailing spaces are stripped).
- ``sentence_spans(ids, boundaries)``: ``[start, end)`` of each sentence of ``ids``;
  a sentence ends after a boundary token (the last one at the end of ``ids``).
- ``snap_to_sentences(kept, spans, budget)``: exactly ``min(budget, n_doc)`` ascending
  document indices: whole sentences ranked by the share of their tokens in ``kept``
  (then by how many), each taken while it fits the budget; the rest of the budget
  goes to the kept tokens outside the chosen sentences, in document order.
"""

from __future__ import annotations

_ENDS = (".", "!", "?")


def boundary_token_ids(tokenizer) -> frozenset[int]:
    """Ids of tokens that end a sentence (see the module contract)."""
    out = set()
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if "\n" in text or text.rstrip().endswith(_ENDS):
            out.add(i)
    return frozenset(out)


def sentence_spans(ids: list[int], boundaries: frozenset[int]) -> list[tuple[int, int]]:
    """[start, end) per sentence of ``ids``; they tile ``range(len(ids))``."""
    spans, start = [], 0
    for i, tok in enumerate(ids):
        if tok in boundaries:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(ids):
        spans.append((start, len(ids)))
    return spans


def snap_to_sentences(kept: list[int], spans: list[tuple[int, int]], budget: int) -> list[int]:
    """Whole sentences around ``kept`` (document indices), exactly ``min(budget, doc length)``."""
    n_doc = spans[-1][1] if spans else 0
    budget = min(budget, n_doc)
    kept_set = set(kept)
    scored = []
    for start, end in spans:
        hits = sum(1 for j in range(start, end) if j in kept_set)
        if hits:
            scored.append((-hits / (end - start), -hits, start, end))
    chosen: set[int] = set()
    for _, _, start, end in sorted(scored):
        if len(chosen) + (end - start) <= budget:
            chosen.update(range(start, end))
    for j in sorted(kept_set):  # the rest of the budget: the heads' own picks
        if len(chosen) >= budget:
            break
        chosen.add(j)
    for j in range(n_doc):  # fewer kept tokens than the budget (should not happen): fill in order
        if len(chosen) >= budget:
            break
        chosen.add(j)
    return sorted(chosen)
