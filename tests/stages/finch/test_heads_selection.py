"""Selection by heads through finch_prefill: a planted retrieval head makes Finch keep
the span around the marker whole, in both modes; early exit reads only the layers up
to the selecting head, stays within the memory bound and then equals a full prefill
of the kept tokens."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import random_parts
from planted import HEAD, doc_with_marker, planted_model

from stages.compression.finch import FinchCompression
from stages.decoding.state import prefill_full
from stages.finch.heads import HeadSet
from stages.finch.prefill import FinchStep, finch_prefill
from stages.prompting import PromptParts

PLANTED = HeadSet("planted", "-", ((0, HEAD),))


def _parts(n: int, at: int, seed: int) -> PromptParts:
    frame = random_parts([(5, 0, 9)], seed=seed)[0]
    return PromptParts(frame.prefix_ids, doc_with_marker(n, at, seed), frame.query_ids)


def _kept(trace: list[FinchStep], row: int, k: int) -> list[int]:
    idx = trace[-1].kept_index[0][row]  # [Hkv, K']
    return idx[0, idx.shape[-1] - k :].tolist()


@pytest.mark.parametrize("mode", ["kv", "early_exit"])
def test_one_pass_keeps_exactly_the_marker_window(mode: str) -> None:
    model = planted_model()
    parts = _parts(100, 50, seed=1)
    cfg = FinchCompression(target_tokens=7, chunk_tokens=128, pool_window=7, mode=mode)
    trace: list[FinchStep] = []
    out = finch_prefill(model, [parts], cfg, 0, trace=trace, heads=PLANTED)
    assert out.context_tokens == [7]
    assert _kept(trace, 0, 7) == list(range(47, 54))


@pytest.mark.parametrize("mode", ["kv", "early_exit"])
def test_chunked_reading_keeps_the_window_and_batches_like_rows_alone(mode: str) -> None:
    model = planted_model()
    parts = [_parts(200, 150, seed=2), _parts(130, 20, seed=3), _parts(90, 60, seed=4)]
    cfg = FinchCompression(target_tokens=32, chunk_tokens=16, mode=mode)
    trace: list[FinchStep] = []
    out = finch_prefill(model, parts, cfg, 0, trace=trace, heads=PLANTED)
    for row, at in enumerate([150, 20, 60]):
        assert set(range(at - 3, at + 4)) <= set(_kept(trace, row, 32))
        alone_trace: list[FinchStep] = []
        alone = finch_prefill(model, [parts[row]], cfg, 0, trace=alone_trace, heads=PLANTED)
        assert _kept(alone_trace, 0, 32) == _kept(trace, row, 32)
        torch.testing.assert_close(out.state.last_logits[row], alone.state.last_logits[0])


def test_early_exit_reads_only_up_to_the_selecting_layer_within_the_bound() -> None:
    model = planted_model()
    model.config.max_position_embeddings = 128  # documents 3-5x the window
    rows = [(5, 600, 9), (5, 400, 9), (5, 400, 9)]
    parts = [_parts(600, 555, seed=5), _parts(400, 300, seed=6), _parts(400, 10, seed=7)]
    cfg = FinchCompression(target_tokens=24, chunk_tokens=32, mode="early_exit")
    trace: list[FinchStep] = []
    out = finch_prefill(model, parts, cfg, 0, trace=trace, heads=PLANTED)
    assert len(trace) == -(-600 // 32)
    assert all(len(step.kept_index) == 1 for step in trace)  # layer 1 never read the document
    for step in trace:
        assert step.slots <= 5 + cfg.target_tokens + cfg.chunk_tokens + 9
        for (pre, _, q), n in zip(rows, step.row_slots, strict=True):
            assert n <= pre + cfg.target_tokens + cfg.chunk_tokens + q
    assert out.context_tokens == [24, 24, 24]
    # The result is a plain full prefill of prefix + kept tokens + query.
    kept = [_kept(trace, row, 24) for row in range(3)]
    assert set(range(552, 559)) <= set(kept[0]) and set(range(297, 304)) <= set(kept[1])
    assert 10 in kept[2]  # the first chunk may keep 1 token (24 * 32 / 400): the marker itself
    prompts = [p.prefix_ids + [p.context_ids[j] for j in k] + p.query_ids for p, k in zip(parts, kept)]
    full = prefill_full(model, prompts, 0)
    torch.testing.assert_close(out.state.last_logits, full.last_logits)
    assert out.state.next_pos.tolist() == [5 + 24 + 9] * 3
    assert int(out.state.cache.layers[1].keys.shape[2]) == 5 + 24 + 9


def test_uncalibrated_model_scores_with_all_heads(tmp_path, monkeypatch) -> None:
    """No head set on disk: every head of every layer, normalised, pools the selection;
    the planted head still pulls the marker window in."""
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    model = planted_model()
    parts = _parts(100, 50, seed=1)
    cfg = FinchCompression(target_tokens=40, chunk_tokens=128, mode="kv")
    trace: list[FinchStep] = []
    finch_prefill(model, [parts], cfg, 0, trace=trace)
    assert set(range(47, 54)) <= set(_kept(trace, 0, 40))


def test_early_exit_needs_one_shared_selection() -> None:
    with pytest.raises(ValueError, match="early_exit"):
        FinchCompression(scoring="paper")
    with pytest.raises(ValueError, match="early_exit"):
        FinchCompression(head_mode="kv_group")
    FinchCompression(scoring="paper", mode="kv", head_mode="kv_group")
