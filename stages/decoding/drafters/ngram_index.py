"""An n-gram index over one growing token sequence: what followed the sequence's own suffix.

Contract: ``NgramIndex(tokens, max_ngram, min_ngram, prefer)`` indexes one row's
lookup sequence (the ORIGINAL document + prompt, never the compressed cache or the
cut text) and grows with ``extend(new_tokens)`` as output is generated.
``match(k)`` (what the prompt-lookup drafter calls) returns ``(draft, n)``: for n from
``max_ngram`` down to ``min_ngram``, the last n tokens of the sequence are looked
up among the n-grams that occurred EARLIER in it, and the first match wins
(longest suffix first). The draft is up to ``k`` tokens that followed that
occurrence, cut at the end of the sequence; ``n`` is the matched suffix length,
the signal adaptive.AcceptanceModel learns acceptance by. No match: ``([], 0)``.
``propose(k)`` is the draft alone.

No self-match: an n-gram is indexed only once the token after it is known, so the
sequence's own suffix is never in the index, and every hit has a continuation.

Tie rule (several earlier occurrences of the same n-gram): ``prefer="latest"``
uses the most recent occurrence, ``"earliest"`` the first one. Latest is the
default: it follows the output's own recent text (a model that repeats itself
repeats its latest phrasing); on the sample QA documents it accepted more drafts
in fewer steps than earliest, and tied on summaries (jobs/results/code-choices.md).

Cost: O(max_ngram - min_ngram + 1) dict operations per appended token and per
proposal; building the index over a document is one pass. No per-step scan of the
document.
"""

from __future__ import annotations

from typing import Literal

Prefer = Literal["latest", "earliest"]


class NgramIndex:
    """Incremental n-gram -> continuation-start index over one row's lookup sequence."""

    def __init__(
        self, tokens: list[int], max_ngram: int, min_ngram: int = 1, prefer: Prefer = "latest"
    ) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if prefer not in ("latest", "earliest"):
            raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.latest = prefer == "latest"
        self.tokens: list[int] = list(tokens)
        # n-gram tuple -> index of the token that followed it (its continuation start).
        # Tuples of different n never collide, so one dict serves every n.
        self._next: dict[tuple[int, ...], int] = self._index_of(self.tokens)

    def _index_of(self, toks: list[int]) -> dict[tuple[int, ...], int]:
        """The table ``extend(toks)`` builds from empty, with one pass of C loops per n (zip
        and dict) instead of Python's per token: the engine's thread builds it as a row
        joins, so its cost holds every running row's next step."""
        table: dict[tuple[int, ...], int] = {}
        size = len(toks)
        for n in range(self.min_ngram, min(self.max_ngram, size - 1) + 1):
            # the n-grams starting at 0 .. size-n-1 and the index of the token after each
            grams = zip(*(toks[i : size - 1] for i in range(n)), strict=False)  # noqa: B905 - lengths differ on purpose
            pairs = zip(grams, range(n, size), strict=True)
            # latest: later occurrences overwrite; earliest: insert backwards, earlier ones overwrite
            table.update(pairs if self.latest else reversed(list(pairs)))
        return table

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens; index every n-gram that now has a known next token."""
        toks = self.tokens
        table = self._next
        lo_n, hi_n = self.min_ngram, self.max_ngram
        for tok in new_tokens:
            end = len(toks)  # the n-grams ending just before `tok` get `end` as continuation
            toks.append(tok)
            for n in range(lo_n, min(hi_n, end) + 1):
                key = tuple(toks[end - n : end])
                if self.latest:
                    table[key] = end
                elif key not in table:
                    table[key] = end

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing the sequence (longest suffix match first)."""
        return self.match(k)[0]

    def match(self, k: int) -> tuple[list[int], int]:
        """(draft, n): the draft and the length n of the suffix it matched (0: none).

        n is the engine's confidence signal: a longer matched suffix predicts a
        higher acceptance (adaptive.AcceptanceModel learns by how much).
        """
        if k <= 0:
            return [], 0
        toks = self.tokens
        size = len(toks)
        table = self._next
        for n in range(min(self.max_ngram, size), self.min_ngram - 1, -1):
            start = table.get(tuple(toks[size - n :]))
            if start is not None:
                return toks[start : min(start + k, size)], n
        return [], 0
