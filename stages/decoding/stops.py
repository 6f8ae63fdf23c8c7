"""Where generation must stop: EOS ids, stop strings, a repetition loop, max_new_tokens.

Contract: ``StopChecker.scan(tokens, start)`` looks at ``tokens[start:]`` (newly
appended, possibly several at once after speculative acceptance) and returns
``(keep, reason)``: keep the first ``keep`` tokens and finish with ``reason``, or
``(len(tokens), None)`` to go on. EOS is kept in the token list (it counts as an
output token); a stop string keeps the token that completed it and the text is cut
at the string by ``cut_text``.

Repeat guard (``repeat_ngram`` n > 0): a row whose last n tokens already occurred
earlier in its own output has started a loop (small models repeat a sentence until
the token limit); it finishes with reason ``repeat`` and keeps the text before the
loop and one cycle of it (a loop shorter than n is caught only after more than one
cycle: the cut goes back to the first). The rule reads the token sequence position by position, so it
cuts exactly where plain decoding would: speculation, batching and the engine do not
change where a row stops (the kept output is a prefix of plain greedy's).
"""

from __future__ import annotations

from collections.abc import Callable


class StopChecker:
    def __init__(
        self,
        eos_ids: frozenset[int],
        max_new_tokens: int,
        stop_strings: tuple[str, ...] = (),
        decode: Callable[[list[int]], str] | None = None,
        repeat_ngram: int = 0,
    ) -> None:
        if stop_strings and decode is None:
            raise ValueError("stop strings need a decode function (the tokenizer)")
        if repeat_ngram < 0:
            raise ValueError(f"repeat_ngram must be >= 0, got {repeat_ngram}")
        self.repeat_ngram = repeat_ngram
        self.eos_ids = eos_ids
        self.max_new_tokens = max_new_tokens
        self.stop_strings = stop_strings
        self.decode = decode
        # A stop string spans at most this many tokens (each token >= 1 char).
        self._window = max((len(s) for s in stop_strings), default=0) + 1

    def scan(self, tokens: list[int], start: int) -> tuple[int, str | None]:
        for i in range(start, len(tokens)):
            if tokens[i] in self.eos_ids:
                return i + 1, "eos"
            if self.stop_strings and self._completes_stop(tokens, i):
                return i + 1, "stop"
            if self.repeat_ngram:
                earlier = self._repeats(tokens, i)
                if earlier is not None:
                    return _one_cycle(tokens, i + 1 - self.repeat_ngram, earlier, i + 1), "repeat"
            if i + 1 >= self.max_new_tokens:
                return i + 1, "length"
        return len(tokens), None

    def _repeats(self, tokens: list[int], i: int) -> int | None:
        """Where the n tokens ending at i occurred last before, ending before them; None if
        they did not (O(i x n), i <= max_new_tokens)."""
        n = self.repeat_ngram
        first = i + 1 - n
        if first < 1:
            return None
        gram = tokens[first : i + 1]
        return next((j for j in range(first - n, -1, -1) if tokens[j : j + n] == gram), None)

    def _completes_stop(self, tokens: list[int], i: int) -> bool:
        lo = max(0, i + 1 - self._window)
        tail = self.decode(tokens[lo : i + 1])
        prev = self.decode(tokens[lo:i]) if i > lo else ""
        # Only a stop string that ends in the text added by token i counts, so a
        # string completed earlier is not found again.
        return any(s in tail and s not in prev for s in self.stop_strings)


def _one_cycle(tokens: list[int], first: int, earlier: int, end: int) -> int:
    """How many tokens to keep of a row whose n-gram at ``first`` repeats the one at
    ``earlier`` (``tokens[:end]`` read): the text before the loop and its first cycle. The
    n-gram's two occurrences are a multiple of the loop's period apart ("the audit report,"
    five tokens, caught by a 12-token guard three cycles in: the row kept "the audit report,
    the audit report, the audit report,"); the loop is the longest stretch ending at ``end``
    with the smallest period of the stretch between them (KMP's border)."""
    start = _periodic_from(tokens, earlier, first - earlier)
    seg = tokens[start:end]
    border = [0] * len(seg)
    for k in range(1, len(seg)):
        b = border[k - 1]
        while b and seg[k] != seg[b]:
            b = border[b - 1]
        border[k] = b + (seg[k] == seg[b])
    period = len(seg) - border[-1]
    return min(first, _periodic_from(tokens, start, period) + period)


def _periodic_from(tokens: list[int], start: int, period: int) -> int:
    """The earliest s <= start from which ``tokens`` repeats with ``period`` up to start + period."""
    while start > 0 and tokens[start - 1] == tokens[start - 1 + period]:
        start -= 1
    return start


def cut_text(text: str, stop_strings: tuple[str, ...]) -> str:
    """Cut decoded output at the first stop string (the string itself removed)."""
    cut = len(text)
    for s in stop_strings:
        j = text.find(s)
        if j != -1:
            cut = min(cut, j)
    return text[:cut]
