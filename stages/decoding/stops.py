"""Where generation must stop: EOS ids, stop strings, a repetition loop, max_new_tokens.

Contract: ``StopChecker.scan(tokens, start)`` looks at ``tokens[start:]`` (newly
appended, possibly several at once after speculative acceptance) and returns
``(keep, reason)``: keep the first ``keep`` tokens and finish with ``reason``, or
``(len(tokens), None)`` to go on. EOS is kept in the token list (it counts as an
output token); a stop string keeps the token that completed it and the text is cut
at the string by ``cut_text``.

Repeat guard (``repeat_ngram`` n > 0): a row whose last n tokens already occurred
earlier in its own output has started a loop (small models repeat a sentence until
the token limit); it finishes with reason ``repeat`` and keeps only the text before
the repeated n tokens. The rule reads the token sequence position by position, so it
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
            if self.repeat_ngram and self._repeats(tokens, i):
                return i + 1 - self.repeat_ngram, "repeat"
            if i + 1 >= self.max_new_tokens:
                return i + 1, "length"
        return len(tokens), None

    def _repeats(self, tokens: list[int], i: int) -> bool:
        """The n tokens ending at i occurred earlier, ending before them (O(i x n), i <= max_new_tokens)."""
        n = self.repeat_ngram
        first = i + 1 - n
        if first < 1:
            return False
        gram = tokens[first : i + 1]
        return any(tokens[j : j + n] == gram for j in range(0, first - n + 1))

    def _completes_stop(self, tokens: list[int], i: int) -> bool:
        lo = max(0, i + 1 - self._window)
        tail = self.decode(tokens[lo : i + 1])
        prev = self.decode(tokens[lo:i]) if i > lo else ""
        # Only a stop string that ends in the text added by token i counts, so a
        # string completed earlier is not found again.
        return any(s in tail and s not in prev for s in self.stop_strings)


def cut_text(text: str, stop_strings: tuple[str, ...]) -> str:
    """Cut decoded output at the first stop string (the string itself removed)."""
    cut = len(text)
    for s in stop_strings:
        j = text.find(s)
        if j != -1:
            cut = min(cut, j)
    return text[:cut]
