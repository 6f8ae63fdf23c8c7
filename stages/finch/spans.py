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
  read in sentences, not in lines. With the tokens' bytes (``Boundaries.token_bytes``,
  what ``sentence_boundaries`` gives) three rules more, for text that is not tidy
  English: a full stop after an abbreviation ("Dr.", "Feb.", "z. B."), an initial ("M.
  Dupont"), a list's enumerator at the start of a line ("1.", "12.", "a."; three digits or
  more there are a year or a figure, and end their sentence), a day's number before
  a month ("am 15. Feb."), or followed by a word in lower case, ends nothing ("Python 3.
  It ...", "equal to x. It ..." and a full stop before a line break still end); "。", "！" and "？" end a sentence with no space after them
  (CJK text, whose full-width marks a byte-level tokenizer splits across tokens); and
  no sentence grows past ``MAX_SENTENCE`` tokens: one that would is cut after its last
  comma, semicolon or colon in its second half, else before its last word, never
  inside a character (a transcript without punctuation is read in pieces, not as one
  "sentence" a budget can only cut at its head).
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

from stages.token_bytes import token_bytes

if TYPE_CHECKING:
    import torch

    from stages.prompting import PromptParts

_ENDS = (".", "!", "?")
MAX_JOINED = 96  # a joined sentence breaks at its next newline past this many tokens
# Why 96: long legal and technical sentences run 60-90 tokens; a piece this size still
# holds a fact with its cue, and a 512-token budget holds five of them.
MAX_SENTENCE = 96
_CJK_ENDS = tuple(c.encode() for c in "。！？")
_SOFT_ENDS = tuple(c.encode() for c in (",", ";", ":", "，", "、", "；", "："))
# Words whose full stop does not end a sentence (lower case, no stop), in the languages
# users brought: English, German, French, Spanish, Italian. Words that often end one
# ("etc", "usw", "Inc") are left out: a false end splits a sentence, a missed one only
# joins two.
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st vs e.g i.e cf approx no nos fig figs vol pp ca
jan feb mar apr jun jul aug sep sept oct nov dec
med nr bzw vgl z.b d.h u.a abs art str tel mio mrd okt dez evtl ggf inkl zzgl dipl ing
mme mlle mm env av bd janv févr avr juil déc p.ex
sra srta dra ud uds sig dott z
""".split())
# Month names and their short forms (the same languages): "15. Feb." is a date, not an end.
MONTHS = frozenset("""
jan january feb february mar march apr april may jun june jul july aug august sep sept september
oct october nov november dec december januar februar märz mai juni juli oktober dezember jän okt dez
janvier février mars avril juin juillet août septembre octobre novembre décembre janv févr juil déc
enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre
gennaio febbraio aprile maggio giugno luglio settembre ottobre dicembre
""".split())


@dataclass(frozen=True)
class Boundaries:
    """Token classes of one tokenizer (see the module contract)."""

    breaks: frozenset[int]
    ends: frozenset[int]
    opens: frozenset[int]
    newlines: frozenset[int] = frozenset()
    #: Each token id's UTF-8 bytes (``token_bytes``); None: the rules of token classes only.
    token_bytes: tuple[bytes, ...] | None = None


def sentence_boundaries(tokenizer) -> Boundaries:
    """Classify every token id of ``tokenizer`` (see the module contract)."""
    breaks, ends, opens, newlines = set(), set(), set(), set()
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    for i, text in enumerate(texts):
        if text == "\n":
            newlines.add(i)
        if "\n" in text:
            breaks.add(i)
        elif text.rstrip().endswith(_ENDS):
            ends.add(i)
        if text[:1].isspace():
            opens.add(i)
    return Boundaries(frozenset(breaks), frozenset(ends), frozenset(opens), frozenset(newlines),
                      token_bytes(tokenizer, texts))


def sentence_spans(ids: list[int], boundaries: Boundaries, join_lines: bool = False) -> list[tuple[int, int]]:
    """[start, end) per sentence of ``ids``; they tile ``range(len(ids))``."""
    b = boundaries
    tb = b.token_bytes
    spans, start = [], 0
    tail = b""  # the last few bytes (token_bytes rules)
    words = _Words()
    # The last token after which a cut ends a clause / ends a word in the piece's second half /
    # is inside no character: a cut prefers them in that order (the module contract). A word's
    # end is tracked apart from a clause's: one slot for both let every later word end win
    # over the comma before it.
    soft = word = clean = -1
    for i, tok in enumerate(ids):
        nxt = ids[i + 1] if i + 1 < len(ids) else None
        wrapped = (
            join_lines and tok in b.newlines and nxt is not None and nxt not in b.opens
            and nxt not in b.breaks and i + 1 - start < MAX_JOINED
        )
        ends = (tok in b.breaks and not wrapped) or (
            tok in b.ends and (nxt is None or nxt in b.opens or nxt in b.breaks)
        )
        if tb is not None:
            data = _bytes_of(tb, tok)
            words.feed(data)
            tail = (tail + data)[-8:]  # a full-width mark split across tokens ends in the tail
            after = b"".join(_bytes_of(tb, t) for t in ids[i + 1 : i + 5])  # enough for the next word
            if ends and tok not in b.breaks and _stop_within_sentence(bytes(words.word), after, words.line_start):
                ends = False
            if not ends and tail.rstrip().endswith(_CJK_ENDS) and not _mid_character(after):
                ends = True
            if not ends and nxt is not None and not _mid_character(after):
                clean = i
                if data.rstrip().endswith(_SOFT_ENDS):
                    soft = i
                elif after[:1].isspace() and i + 1 - start > MAX_SENTENCE // 2:
                    word = i
            if not ends and i + 1 - start >= MAX_SENTENCE and nxt is not None:
                half = start + MAX_SENTENCE // 2
                cut = soft if soft >= half else word if word >= half else clean if clean >= start else -1
                if cut >= 0:
                    spans.append((start, cut + 1))
                    start = cut + 1
                    soft = word = clean = -1
                    continue
        if ends:
            spans.append((start, i + 1))
            start = i + 1
            soft = word = clean = -1
    if start < len(ids):
        spans.append((start, len(ids)))
    return spans


class _Words:
    """The word being read (its bytes since the last whitespace, at most 24) and whether it
    is the first of its line, fed token bytes one token at a time."""

    _SPACE = frozenset(b" \t\r\n")

    def __init__(self) -> None:
        self.word = bytearray()
        self.line_start = True
        self._gap, self._gap_newline = True, True  # the document starts as after a newline

    def feed(self, data: bytes) -> None:
        for byte in data:
            if byte in self._SPACE:
                self._gap = True
                self._gap_newline = self._gap_newline or byte == 0x0A
            else:
                if self._gap:
                    self.word.clear()
                    self.line_start, self._gap, self._gap_newline = self._gap_newline, False, False
                if len(self.word) < 24:
                    self.word.append(byte)


def _bytes_of(tb: tuple[bytes, ...], tok: int) -> bytes:
    return tb[tok] if 0 <= tok < len(tb) else b""


def _mid_character(data: bytes) -> bool:
    """Whether a token of these bytes starts inside a UTF-8 character (a continuation byte)."""
    return bool(data) and 0x80 <= data[0] < 0xC0


def _stop_within_sentence(word: bytes, after: bytes, line_start: bool) -> bool:
    """Whether the full stop ending ``word`` (the bytes since the last space) stays inside
    its sentence (the module contract): an abbreviation, an initial, an enumerator that
    starts its line, a day's number before a month, or a next word in lower case
    (``after``: the next token's bytes)."""
    if not word.endswith(b".") or after.lstrip(b" \t")[:1] in (b"\n", b"\r"):
        return False  # a line break after a full stop ends the sentence whatever came before
    stem = word.decode("utf-8", "replace").rstrip(".").lstrip("([\"'«„“")
    split = after.decode("utf-8", "replace").split()
    nxt = split[0] if split else ""
    short = (stem.isdigit() and len(stem) <= 2) or (len(stem) == 1 and stem.isalpha())
    if stem.lower() in ABBREVIATIONS or (len(stem) == 1 and stem.isupper()) or (short and line_start):
        return True
    if stem.isdigit() and len(stem) <= 2 and nxt.rstrip(".").lower() in MONTHS:
        return True
    return bool(nxt) and nxt[0].islower()


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
