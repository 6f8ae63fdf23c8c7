"""The n-gram index behind prompt lookup, on hand-made sequences and against a brute-force search."""

from __future__ import annotations

import random

import pytest

from stages.decoding.drafters.ngram_index import NgramIndex, Prefer


def propose_draft(tokens: list[int], k: int, max_ngram: int, min_ngram: int = 1, prefer: Prefer = "latest") -> list[int]:
    """One-shot drafting over ``tokens`` (a fresh index)."""
    return NgramIndex(tokens, max_ngram, min_ngram, prefer).propose(k)


def brute_force(tokens: list[int], k: int, max_n: int, min_n: int, prefer: str) -> list[int]:
    """Scan every earlier occurrence of the suffix: the definition the index must match."""
    size = len(tokens)
    for n in range(min(max_n, size), min_n - 1, -1):
        suffix = tokens[size - n :]
        # Occurrences ending before the sequence end (the suffix itself excluded).
        starts = [s for s in range(0, size - n) if tokens[s : s + n] == suffix]
        if starts:
            s = starts[-1] if prefer == "latest" else starts[0]
            return tokens[s + n : min(s + n + k, size)]
    return []


def test_longest_suffix_wins():
    # 1-gram "3" is followed by 9 (most recently); the 2-gram "2 3" is followed by 4.
    seq = [1, 2, 3, 4, 5, 7, 3, 9, 8, 2, 3]
    assert propose_draft(seq, 2, max_ngram=2) == [4, 5]
    assert propose_draft(seq, 2, max_ngram=1) == [9, 8]


def test_tie_rule_latest_vs_earliest():
    seq = [7, 1, 2, 7, 3, 4, 7]
    assert propose_draft(seq, 2, max_ngram=1, prefer="latest") == [3, 4]
    assert propose_draft(seq, 2, max_ngram=1, prefer="earliest") == [1, 2]


def test_no_self_match():
    assert propose_draft([1, 2, 3], 4, max_ngram=3) == []
    # The only earlier "5" is followed by the suffix itself: that is a real match.
    assert propose_draft([5, 5], 4, max_ngram=2) == [5]


def test_caps_at_k_and_at_sequence_end():
    seq = [1, 2, 3, 4, 5, 6, 1, 2]
    assert propose_draft(seq, 3, max_ngram=2) == [3, 4, 5]
    assert propose_draft(seq, 100, max_ngram=2) == [3, 4, 5, 6, 1, 2]
    assert propose_draft(seq, 0, max_ngram=2) == []


def test_min_and_max_ngram():
    seq = [1, 2, 3, 9, 2, 3, 8, 4, 3]
    # Only a 1-gram ("3") matches.
    assert propose_draft(seq, 1, max_ngram=3, min_ngram=1) == [8]
    assert propose_draft(seq, 1, max_ngram=3, min_ngram=2) == []
    idx = NgramIndex([1, 2, 3, 4, 0, 1, 2, 3], max_ngram=2)
    assert idx.match(1) == ([4], 2)  # n reported is the matched length, capped by max_ngram


def test_incremental_extend_matches_fresh_index_and_brute_force():
    rng = random.Random(0)
    for prefer in ("latest", "earliest"):
        for _ in range(30):
            seq = [rng.randrange(6) for _ in range(rng.randrange(1, 40))]
            idx = NgramIndex(seq[:5], max_ngram=4, min_ngram=1, prefer=prefer)
            for tok in seq[5:]:
                idx.extend([tok])
            for k in (1, 3, 8):
                want = brute_force(seq, k, 4, 1, prefer)
                assert idx.propose(k) == want
                assert propose_draft(seq, k, 4, 1, prefer) == want


@pytest.mark.parametrize("kw", [dict(max_ngram=0), dict(max_ngram=2, min_ngram=3), dict(max_ngram=2, prefer="middle")])
def test_bad_settings_raise(kw):
    with pytest.raises(ValueError):
        NgramIndex([1, 2, 3], **kw)


@pytest.mark.parametrize("prefer", ["latest", "earliest"])
def test_an_index_built_at_once_equals_one_grown_token_by_token(prefer):
    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(rng.randint(1, 6)) for _ in range(rng.randint(0, 50))]
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        built, grown = NgramIndex(tokens, hi, lo, prefer), NgramIndex([], hi, lo, prefer)
        grown.extend(tokens)
        assert built._next == grown._next and built.tokens == grown.tokens
        more = [rng.randrange(6) for _ in range(4)]
        built.extend(more)
        grown.extend(more)
        assert built._next == grown._next and built.match(4) == grown.match(4)
