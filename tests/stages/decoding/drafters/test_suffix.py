"""The suffix drafter: an output index that learns continuations from finished rows,
bounded memory (old outputs subtracted), and the choice between its two sources."""

from __future__ import annotations

import pytest

from stages.decoding.config import DecodeConfig
from stages.decoding.drafters.suffix import OutputIndex, SuffixDrafter


def test_output_index_follows_the_most_frequent_path():
    idx = OutputIndex(min_ngram=1, max_ngram=3, max_outputs=10)
    for out in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 9, 9]):
        idx.add(out)
    # After [7, 1, 2]: 3 follows "1 2" three times; then "2 3" -> 4 twice in three.
    tokens, n = idx.draft([7, 1, 2], k=5, min_path_prob=0.1, spec_factor=4.0)
    assert n == 2 and tokens[:2] == [3, 4]
    assert tokens[2] in (5, 6)  # 1/2 each after "3 4": the path probability 2/3 x 1/2 stays above 0.1
    # A high floor stops where the path becomes uncertain.
    assert idx.draft([7, 1, 2], k=5, min_path_prob=0.5, spec_factor=4.0)[0] == [3, 4]
    # Speculation length follows the match: one matched token, at most spec_factor tokens.
    assert len(idx.draft([9, 1], k=8, min_path_prob=0.0, spec_factor=2.0)[0]) == 2
    assert idx.draft([42], k=4, min_path_prob=0.0, spec_factor=4.0) == ([], 0)


def test_output_index_memory_is_bounded():
    idx = OutputIndex(min_ngram=1, max_ngram=2, max_outputs=2)
    idx.add([1, 2, 3])
    idx.add([4, 5, 6])
    idx.add([7, 8, 9])  # evicts [1, 2, 3] and subtracts its counts
    assert len(idx) == 2
    assert idx.draft([1], k=2, min_path_prob=0.0, spec_factor=4.0) == ([], 0)
    assert idx.draft([7], k=2, min_path_prob=0.0, spec_factor=4.0)[0] == [8, 9]
    with pytest.raises(ValueError, match="max_outputs"):
        OutputIndex(1, 2, 0)


def test_the_drafter_takes_the_longer_match_of_prompt_and_outputs():
    cfg = DecodeConfig(max_new_tokens=8, eos_ids=frozenset(), speculative="suffix", max_ngram=3)
    d = SuffixDrafter(cfg)
    header = [90, 91]  # the prompt's end (the chat template's assistant header)
    d.begin(0, [10, 11, 12, 13, *header])
    d.extend(0, [50, 51, 52, 53])
    d.finish(0, [50, 51, 52, 53])  # the run has written one output
    d.begin(1, [20, 21, 22, 50, 77, *header])
    # Nothing generated yet: the outputs source knows what followed the header.
    first = d.propose([1], [4])[0]
    assert first.tokens[:3] == [50, 51, 52] and first.level[0] == "outputs"
    d.extend(1, [50])
    # "50" matched in the prompt (n=1, followed by 77) and in the outputs (n=3 with the header):
    # the longer match wins.
    assert d.propose([1], [2])[0].tokens == [51, 52]
    d.extend(1, [77])
    draft = d.propose([1], [3])[0]  # "50 77" occurs in the prompt only, followed by the header
    assert (draft.tokens, draft.level) == ([90, 91, 50], ("prompt", 2))
    d.finish(1, [50, 77])
    assert len(d.outputs) == 2
