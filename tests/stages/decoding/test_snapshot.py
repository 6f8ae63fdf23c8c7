"""stages/decoding/snapshot.py: an engine's numbers, summed over engines and said once."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from stages.decoding.snapshot import EngineSnapshot, describe, engines_line


def test_one_engine_reads_as_the_engine_line_always_did() -> None:
    s = EngineSnapshot(decoding=3, decoding_tokens=41, prefilling=1, queued=5)
    assert describe(s) == "3 decoding (41 tokens), 1 prefilling, 5 queued"
    assert engines_line(s) == "engine: 3 decoding (41 tokens), 1 prefilling, 5 queued"
    reading = EngineSnapshot(compressing=2, compressing_tokens=3500, chunks_read=2, chunks_total=7,
                             reading_left_s=75.0, queued=1)
    assert describe(reading) == ("0 decoding (0 tokens), 2 compressing (3500 document tokens, chunk 2 of 7, "
                                 "~1m15s left), 0 prefilling, 1 queued")
    unknown = EngineSnapshot(compressing=1, compressing_tokens=900, chunks_read=4)
    assert "1 compressing (900 document tokens, chunks read: 4), " in describe(unknown)


def test_engines_are_summed_and_said_with_their_count() -> None:
    a = EngineSnapshot(decoding=2, decoding_tokens=10, prefilling=1, queued=3, rows_done=4, tokens_out=40,
                       prefill_s=3.0, step_s=1.0)
    b = EngineSnapshot(decoding=1, decoding_tokens=5, compressing=1, compressing_tokens=2000, chunks_read=1,
                       chunks_total=4, queued=2, rows_done=2, tokens_out=20, prefill_s=1.0, step_s=3.0)
    c = EngineSnapshot(compressing=2, compressing_tokens=1000, chunks_read=3, chunks_total=5, reading_left_s=12.0,
                       rows_done=1, tokens_out=8)
    total = EngineSnapshot.total([a, b, c])
    assert engines_line(total, 3) == ("3 engines: 3 decoding (15 tokens), 3 compressing (3000 document tokens, "
                                      "chunk 4 of 9, ~12s left), 1 prefilling, 5 queued")
    # The ETA's tuple: sums, and the prefill share of the summed engine time.
    assert total.progress() == (7, 68, 3, 15, pytest.approx(4.0 / 8.0))
    assert EngineSnapshot.total([a]).progress() == a.progress() == (4, 40, 2, 10, pytest.approx(0.75))
    # An engine not compressing now adds no chunks; one whose chunks are not known leaves the total unknown.
    stale_chunks = EngineSnapshot(chunks_read=9, chunks_total=9)
    assert EngineSnapshot.total([b, stale_chunks]).chunks_total == 4
    assert EngineSnapshot.total([b, EngineSnapshot(compressing=1, chunks_read=2)]).chunks_total is None
    assert EngineSnapshot.total([]) == EngineSnapshot()
    assert EngineSnapshot().progress() == (0, 0, 0, 0, 0.0)


def test_a_snapshot_crosses_processes_as_a_dict() -> None:
    s = EngineSnapshot(decoding=1, compressing=1, chunks_total=3, reading_left_s=2.5, prefill_s=0.5)
    assert EngineSnapshot.from_dict(asdict(s)) == s
    assert EngineSnapshot.from_dict({**asdict(s), "added_later": 1}) == s  # a newer reporter's field
