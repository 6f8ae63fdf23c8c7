"""The retrieval methods' shared chunks (stages/compression/chunks.py): chunks tile the
document and end between characters, the budget is filled best score first in document
order, and a cut never splits a character (a CJK document through bm25 with the embedded
tokenizer)."""

from __future__ import annotations

import random

import pytest

from stages.compression.chunks import assemble, scored_result, select_chunks, split_chunks
from stages.token_bytes import CharacterEdges

# Ids 90-99 stand for the pieces that continue a character: a cut before one splits it.
EDGES = CharacterEdges(frozenset(range(90, 100)))


def test_split_chunks_covers_document() -> None:
    chunks = split_chunks(list(range(70)), 32)
    assert [len(c) for c in chunks] == [32, 32, 6]
    assert sum(chunks, []) == list(range(70))
    with pytest.raises(ValueError, match="chunk_tokens"):
        split_chunks([1, 2], 0)


@pytest.mark.parametrize("seed", range(5))
def test_select_fills_budget_exactly_in_document_order(seed: int) -> None:
    rng = random.Random(seed)
    lens = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
    scores = [rng.random() for _ in lens]
    for target in (1, 7, 33, 100, sum(lens), sum(lens) + 5):
        kept = select_chunks(scores, lens, target)
        assert sum(n for _, n in kept) == min(target, sum(lens))
        idx = [i for i, _ in kept]
        assert idx == sorted(idx) and len(set(idx)) == len(idx)
        # Everything kept scores at least as high as everything left out, and only
        # the lowest-scoring kept chunk may be cut.
        left_out = set(range(len(lens))) - set(idx)
        lowest = min(kept, key=lambda k: (scores[k[0]], -k[0]))
        assert all(scores[i] >= scores[j] for i in idx for j in left_out)
        assert all(n == lens[i] for i, n in kept if (i, n) != lowest)


def test_select_rejects_bad_budget() -> None:
    with pytest.raises(ValueError, match="target_tokens"):
        select_chunks([0.1], [3], 0)


def test_assemble_cuts_head_of_chunk() -> None:
    chunks = [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert assemble(chunks, [(0, 3), (2, 1)]) == [1, 2, 3, 7]


def test_chunks_end_between_characters() -> None:
    # Characters of three pieces: a lead id (< 90) and two continuing ones.
    doc = [t for c in range(40) for t in (c, 90 + c % 10, 90 + (c + 1) % 10)]
    chunks = split_chunks(doc, 8, EDGES)
    assert sum(chunks, []) == doc
    assert all(c[0] < 90 for c in chunks) and all(6 <= len(c) <= 8 for c in chunks[:-1])
    # A character longer than the size is one chunk, not cut.
    assert split_chunks([1, 90, 91, 92, 93, 2], 2, EDGES) == [[1, 90, 91, 92, 93], [2]]


def test_the_last_kept_chunk_ends_between_characters() -> None:
    chunks = [[1, 2, 3, 4], [5, 90, 91, 6], [7, 8, 9, 10]]
    res = scored_result(chunks, [0.9, 0.5, 0.1], target_tokens=6, edges=EDGES)
    assert res.context_ids == [1, 2, 3, 4] and res.spans == [0, 4]  # not 5, 90: part of 5, 90, 91
    assert scored_result(chunks, [0.9, 0.5, 0.1], target_tokens=6).context_ids == [1, 2, 3, 4, 5, 90]
    whole = scored_result(chunks, [0.9, 0.5, 0.1], target_tokens=7, edges=EDGES)
    assert whole.context_ids == [1, 2, 3, 4, 5, 90, 91]  # the character ends there: nothing lost


def test_cjk_document_keeps_whole_characters_through_bm25_and_truncate(tokenizer) -> None:
    from stages.compression.bm25 import Bm25Compression, bm25_result
    from stages.compression.truncate import truncate_ids
    from stages.token_bytes import CharacterEdges

    edges = CharacterEdges.of(tokenizer)
    text = "北京是中国的首都，也是一座历史悠久的城市。" * 30 + "东京是日本的首都。" * 30
    doc = tokenizer(text, add_special_tokens=False)["input_ids"]
    query = tokenizer("日本的首都", add_special_tokens=False)["input_ids"]
    for target in (32, 35, 38, 64, 101):
        kept = bm25_result(doc, query, Bm25Compression(target_tokens=target, chunk_tokens=13), edges)
        assert target - 3 <= len(kept.context_ids) <= target
        assert "\ufffd" not in tokenizer.decode(kept.context_ids)
        for keep in ("head", "tail", "head_tail"):
            cut = truncate_ids(doc, target, keep, edges)
            assert target - 6 <= len(cut) <= target and "\ufffd" not in tokenizer.decode(cut)
    # Without the edges the same cuts split characters: the test can fail.
    assert "\ufffd" in tokenizer.decode(truncate_ids(doc, 32, "head"))
