"""Drafter ``prompt_lookup``: copy what followed the output's last n-gram in the prompt.

Prompt lookup decoding (Saxena, 2023; the n-gram drafter of vLLM and transformers'
``prompt_lookup_num_tokens``): summaries and answers copy phrases of their document,
so the tokens that followed the output's last ``n`` tokens earlier in the ORIGINAL
document + prompt + output so far are a good guess at what comes next. Longest
suffix first (``max_ngram`` down to ``min_ngram``). Unlike transformers' generator, which
takes the earliest match and cuts a draft at EOS, the most recent occurrence wins here
(ngram_index.py says why; jobs/results/code-choices.md has the measurement): the drafts
differ, the text does not (verification decides every token).
The matched length ``n`` is the draft's level (a longer match is accepted more often).
Per row: one NgramIndex (ngram_index.py), dropped when the row finishes.
"""

from __future__ import annotations

from collections.abc import Sequence

from stages.decoding.drafters.base import Draft, Drafter
from stages.decoding.drafters.ngram_index import NgramIndex


class PromptLookup(Drafter):
    name = "prompt_lookup"
    summary = "n-gram matches in the original document, prompt and output so far"

    def __init__(self, config) -> None:
        super().__init__(config)
        self._index: dict[int, NgramIndex] = {}

    def begin(self, row: int, lookup_ids: Sequence[int]) -> None:
        self._index[row] = NgramIndex(list(lookup_ids), self.config.max_ngram, self.config.min_ngram)

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        self._index[row].extend(list(tokens))

    def propose(self, rows: Sequence[int], limits: Sequence[int]) -> list[Draft]:
        out = []
        for row, k in zip(rows, limits, strict=True):
            tokens, n = self._index[row].match(k)
            out.append(Draft(tokens, n))
        return out

    def finish(self, row: int, output: Sequence[int]) -> None:
        self._index.pop(row, None)
