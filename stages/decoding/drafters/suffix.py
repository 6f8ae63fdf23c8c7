"""Drafter ``suffix``: drafts from the row's prompt AND from the outputs the run already wrote.

After SuffixDecoding (Oliaro et al., 2024, arXiv:2411.04975): a batch job generates
many outputs of the same kind (a night of summaries, the same questions over many
documents), and they repeat each other's phrasing, so the continuations seen after a
context in earlier outputs are good drafts for later rows, beside the row's own prompt.

Two sources, per step the one with the longer match wins (ties: the prompt):
- ``prompt``: the row's original prompt + its output so far (an NgramIndex, exactly
  the prompt-lookup drafter's source);
- ``outputs``: a frequency index over the outputs of rows that finished on this
  engine (``OutputIndex``): for every context of ``min_ngram..max_ngram`` tokens in
  an output, how often each token followed it. The draft follows the most frequent
  continuation token by token (at each token the longest known context decides) while
  the product of the chosen tokens' frequencies stays at or above ``min_path_prob``
  and the draft is at most ``spec_factor`` x the matched length (SuffixDecoding's
  adaptive speculation length: a longer match earns a longer draft).
Levels are ``("prompt", n)`` and ``("outputs", n)``, so the engine learns the two
sources' acceptance apart. The index holds the last ``max_outputs`` outputs (older
ones are subtracted again), so its memory is bounded on a long night.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from stages.decoding.drafters.base import Draft, Drafter
from stages.decoding.drafters.ngram_index import NgramIndex


class OutputIndex:
    """Next-token counts after every short context of recent outputs (see module docstring).

    Cost: ``(max_ngram - min_ngram + 1)`` dict updates per output token when an output
    is added or evicted; ``draft`` is O(length x n-gram range) dict lookups.
    """

    def __init__(self, min_ngram: int, max_ngram: int, max_outputs: int) -> None:
        if min_ngram < 1 or max_ngram < min_ngram or max_outputs < 1:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram and max_outputs >= 1, got {min_ngram}, {max_ngram}, {max_outputs}"
            )
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.max_outputs = max_outputs
        self._next: dict[tuple[int, ...], dict[int, int]] = {}
        self._outputs: deque[tuple[int, ...]] = deque()

    def __len__(self) -> int:
        return len(self._outputs)

    def add(self, output: Sequence[int]) -> None:
        """Count every (context -> next token) of ``output``; evicts the oldest output past the cap."""
        out = tuple(output)
        if len(out) < 2:
            return
        self._count(out, +1)
        self._outputs.append(out)
        if len(self._outputs) > self.max_outputs:
            self._count(self._outputs.popleft(), -1)

    def _count(self, out: tuple[int, ...], sign: int) -> None:
        for end in range(1, len(out)):
            nxt = out[end]
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                key = out[end - n : end]
                counts = self._next.setdefault(key, {})
                c = counts.get(nxt, 0) + sign
                if c > 0:
                    counts[nxt] = c
                else:
                    counts.pop(nxt, None)
                    if not counts:
                        del self._next[key]

    def _best(self, context: Sequence[int]) -> tuple[int, float, int]:
        """(token, frequency, matched length) of the most frequent continuation; (-1, 0, 0) if none."""
        for n in range(min(self.max_ngram, len(context)), self.min_ngram - 1, -1):
            counts = self._next.get(tuple(context[len(context) - n :]))
            if counts:
                token, c = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
                return token, c / sum(counts.values()), n
        return -1, 0.0, 0

    def draft(self, context: Sequence[int], k: int, min_path_prob: float, spec_factor: float) -> tuple[list[int], int]:
        """(tokens, n): the most frequent path after ``context``, n = the first token's matched length."""
        if k <= 0 or not self._next:
            return [], 0
        tail = list(context[-self.max_ngram :])
        tokens: list[int] = []
        prob, first_n = 1.0, 0
        while len(tokens) < k:
            token, p, n = self._best(tail)
            if n == 0 or prob * p < min_path_prob:
                break
            if not tokens:
                first_n = n
                k = min(k, max(1, int(spec_factor * n)))
            prob *= p
            tokens.append(token)
            tail = (tail + [token])[-self.max_ngram :]
        return tokens, first_n


class SuffixDrafter(Drafter):
    name = "suffix"
    summary = "the row's prompt and the outputs earlier rows of the run generated (SuffixDecoding)"

    #: Path-probability floor and speculation factor (SuffixDecoding's min_token_prob and
    #: max_spec_factor play these roles); the engine's adaptive width decides the rest.
    min_path_prob = 0.1
    spec_factor = 4.0
    max_outputs = 512

    def __init__(self, config) -> None:
        super().__init__(config)
        self.outputs = OutputIndex(config.min_ngram, config.max_ngram, self.max_outputs)
        self._prompt: dict[int, NgramIndex] = {}
        self._header: dict[int, tuple[int, ...]] = {}

    def begin(self, row: int, lookup_ids: Sequence[int]) -> None:
        self._prompt[row] = NgramIndex(list(lookup_ids), self.config.max_ngram, self.config.min_ngram)
        # The prompt's last tokens (the chat template's assistant header, the same for
        # every row) are indexed with the output, so the outputs source drafts an
        # output's first tokens too.
        self._header[row] = tuple(lookup_ids[-self.config.max_ngram :])

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        self._prompt[row].extend(list(tokens))

    def propose(self, rows: Sequence[int], limits: Sequence[int]) -> list[Draft]:
        out = []
        for row, k in zip(rows, limits, strict=True):
            index = self._prompt[row]
            p_tokens, p_n = index.match(k)
            # The outputs' contexts end in output tokens (or the shared header before them).
            o_tokens, o_n = self.outputs.draft(index.tokens, k, self.min_path_prob, self.spec_factor)
            if o_n > p_n:
                out.append(Draft(o_tokens, ("outputs", o_n)))
            else:
                out.append(Draft(p_tokens, ("prompt", p_n)))
        return out

    def finish(self, row: int, output: Sequence[int]) -> None:
        self._prompt.pop(row, None)
        self.outputs.add(self._header.pop(row, ()) + tuple(output))
