"""The prompt-lookup drafter: per-row indexes over the original prompt plus output."""

from __future__ import annotations

from stages.decoding.config import DecodeConfig
from stages.decoding.drafters.prompt_lookup import PromptLookup


def test_rows_draft_from_their_own_prompt_and_output_and_are_forgotten():
    cfg = DecodeConfig(max_new_tokens=8, eos_ids=frozenset(), speculative="prompt_lookup", max_ngram=2)
    d = PromptLookup(cfg)
    d.begin(0, [1, 2, 3, 4, 5])
    d.begin(1, [7, 8, 9, 7, 8])
    d.extend(0, [2, 3])
    drafts = d.propose([0, 1], [2, 3])
    assert drafts[0].tokens == [4, 5] and drafts[0].level == 2  # "2 3" matched, 4 5 followed
    assert drafts[1].tokens == [9, 7, 8] and drafts[1].level == 2
    assert d.propose([0], [0])[0].tokens == []  # a limit of 0 drafts nothing
    d.finish(0, [2, 3])
    assert 0 not in d._index and 1 in d._index
