"""The keep schedule: linear in the document read so far, exact at the end."""

from __future__ import annotations

import pytest

from stages.finch.schedule import chunk_spans, kept_after_chunks


@pytest.mark.parametrize(
    ("doc", "target", "chunk"),
    [(4000, 512, 256), (4096, 512, 512), (1000, 1000, 128), (300, 1024, 64), (17, 5, 16), (20000, 1024, 512)],
)
def test_schedule_is_monotone_bounded_and_exact(doc: int, target: int, chunk: int) -> None:
    spans = chunk_spans(doc, chunk)
    kept = kept_after_chunks(doc, target, chunk)
    assert len(kept) == len(spans)
    assert kept[-1] == min(target, doc)
    prev = 0
    for (s, e), k in zip(spans, kept, strict=True):
        assert prev <= k <= min(target, e)  # never over budget, never more than read
        assert k - prev <= e - s  # growth fits in the chunk's candidates
        prev = k


def test_short_document_keeps_everything_read() -> None:
    assert kept_after_chunks(100, 512, 32) == [32, 64, 96, 100]


def test_spans_cover_the_document() -> None:
    assert chunk_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_spans(0, 4) == []


def test_bad_values_raise() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_spans(10, 0)
    with pytest.raises(ValueError, match="target_tokens"):
        kept_after_chunks(10, 0, 4)


def test_the_kept_count_is_the_floor_of_the_linear_share() -> None:
    """kept_i = floor(T * n_i / N) (the module docstring): 3 of 10 tokens in chunks of 4
    keep 1.2 -> 1, 2.4 -> 2, then 3; rounding up would keep more than the share early."""
    assert kept_after_chunks(10, 3, 4) == [1, 2, 3]
    assert kept_after_chunks(4000, 512, 256)[:3] == [32, 65, 98]  # 32.768, 65.536, 98.304
