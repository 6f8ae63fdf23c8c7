"""Where generation must stop: EOS ids, stop strings, and max_new_tokens, never past them.

Contract: ``StopChecker.scan(tokens, start)`` looks at ``tokens[start:]`` (newly
appended, possibly several at once after speculative acceptance) and returns
``(keep, reason)``: keep the first ``keep`` tokens and finish with ``reason``, or
``(len(tokens), None)`` to go on. EOS is kept in the token list (it counts as an
output token); a stop string keeps the token that completed it and the text is cut
at the string by ``cut_text``.
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
    ) -> None:
        if stop_strings and decode is None:
            raise ValueError("stop strings need a decode function (the tokenizer)")
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
            if i + 1 >= self.max_new_tokens:
                return i + 1, "length"
        return len(tokens), None

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
