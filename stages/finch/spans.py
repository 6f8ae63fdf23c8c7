"""Whole sentences from a token selection (Finch ``keep: sentences``, early-exit mode; in
mode kv the passes rank sentences themselves: evidence.pool_sentences).

Why: the question's retrieval heads attend to the tokens that MATCH the question
("the first prize at the Valparaiso hackathon"), and pooling keeps their
neighbourhood; the answer often sits just after them ("... was a brass telescope")
and falls outside the kept window. Keeping whole sentences around what the heads
chose keeps the answer with its cue, and gives the model whole sentences to read.

Contract:
- ``sentence_boundaries(tokenizer)``: the token classes that end sentences: ``breaks``
  (text contains a newline), ``ends`` (text ends in ``.``, ``!`` or ``?`` once
  trailing spaces are stripped), ``opens`` (text starts with whitespace) and
  ``newlines`` (text is exactly one newline: a line wrap, if the next line goes on).
- ``sentence_spans(ids, boundaries, join_lines=False)``: ``[start, end)`` of each
  sentence of ``ids``; a sentence ends after a break, or after an end token followed
  by an opening token, a break or the end of ``ids`` (so "3.1" and "e.g" do not end
  sentences). ``join_lines``: a single newline followed by a token that neither opens
  with whitespace nor breaks (wrapped prose, not an indented code line or a blank
  line) continues the sentence, up to ``MAX_JOINED`` tokens: hard-wrapped text is
  read in sentences, not in lines.
- ``sentence_index(parts, boundaries, join_lines, device)``: [B, N] each document token's
  sentence per row (mode kv's ranking of whole sentences).
- ``snap_to_sentences(kept, spans, budget, score=None)``: exactly ``min(budget, n_doc)``
  ascending document indices: whole sentences holding kept tokens, best first, each
  taken while it fits the budget; the rest of the budget goes to the kept tokens
  outside the chosen sentences (best score first, else document order). A sentence's
  rank: its best kept token's ``score`` when given, then the share of its tokens kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from stages.prompting import PromptParts

_ENDS = (".", "!", "?")
MAX_JOINED = 96  # a joined sentence breaks at its next newline past this many tokens


@dataclass(frozen=True)
class Boundaries:
    """Token classes of one tokenizer (see the module contract)."""

    breaks: frozenset[int]
    ends: frozenset[int]
    opens: frozenset[int]
    newlines: frozenset[int] = frozenset()


def sentence_boundaries(tokenizer) -> Boundaries:
    """Classify every token id of ``tokenizer`` (see the module contract)."""
    breaks, ends, opens, newlines = set(), set(), set(), set()
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if text == "\n":
            newlines.add(i)
        if "\n" in text:
            breaks.add(i)
        elif text.rstrip().endswith(_ENDS):
            ends.add(i)
        if text[:1].isspace():
            opens.add(i)
    return Boundaries(frozenset(breaks), frozenset(ends), frozenset(opens), frozenset(newlines))


def sentence_spans(ids: list[int], boundaries: Boundaries, join_lines: bool = False) -> list[tuple[int, int]]:
    """[start, end) per sentence of ``ids``; they tile ``range(len(ids))``."""
    b = boundaries
    spans, start = [], 0
    for i, tok in enumerate(ids):
        nxt = ids[i + 1] if i + 1 < len(ids) else None
        wrapped = (
            join_lines and tok in b.newlines and nxt is not None and nxt not in b.opens
            and nxt not in b.breaks and i + 1 - start < MAX_JOINED
        )
        if (tok in b.breaks and not wrapped) or (
            tok in b.ends and (nxt is None or nxt in b.opens or nxt in b.breaks)
        ):
            spans.append((start, i + 1))
            start = i + 1
    if start < len(ids):
        spans.append((start, len(ids)))
    return spans


def snap_to_sentences(
    kept: list[int], spans: list[tuple[int, int]], budget: int, score: Mapping[int, float] | None = None
) -> list[int]:
    """Whole sentences around ``kept`` (document indices), exactly ``min(budget, doc length)``."""
    n_doc = spans[-1][1] if spans else 0
    budget = min(budget, n_doc)
    kept_set = set(kept)
    ranked = []
    for start, end in spans:
        hits = [j for j in range(start, end) if j in kept_set]
        if hits:
            best = max(score[j] for j in hits) if score is not None else 0.0
            ranked.append((-best, -len(hits) / (end - start), -len(hits), start, end))
    chosen: set[int] = set()
    for *_, start, end in sorted(ranked):
        if len(chosen) + (end - start) <= budget:
            chosen.update(range(start, end))
    rest = sorted(kept_set - chosen, key=(lambda j: (-score[j], j)) if score is not None else None)
    for j in rest:  # the rest of the budget: the heads' own picks
        if len(chosen) >= budget:
            break
        chosen.add(j)
    for j in range(n_doc):  # fewer kept tokens than the budget (should not happen): fill in order
        if len(chosen) >= budget:
            break
        chosen.add(j)
    return sorted(chosen)


def sentence_index(parts: list[PromptParts], boundaries: Boundaries, join_lines: bool, device) -> torch.Tensor:
    """[B, N] long on ``device``: the sentence (``sentence_spans``) of each document token
    per row, N = the longest document (0 past a row's end; at least one column): what
    ``keep: sentences`` in mode kv ranks candidates by."""
    import torch

    width = max(1, max(len(p.context_ids) for p in parts))
    out = torch.zeros((len(parts), width), dtype=torch.long)
    for r, p in enumerate(parts):
        for k, (a, e) in enumerate(sentence_spans(p.context_ids, boundaries, join_lines=join_lines)):
            out[r, a:e] = k
    return out.to(device)
