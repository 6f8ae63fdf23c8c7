"""Selection by heads through finch_prefill: a planted retrieval head makes Finch keep
the span around the marker whole, in both modes; early exit reads only the layers up
to the selecting head (or up to max_scoring_layers), stays within the memory bound and
then equals a full prefill of the kept tokens."""

from __future__ import annotations

import logging

import pytest
import torch
from finch_testlib import heads_config, random_parts
from planted import HEAD, doc_with_marker, planted_model

from stages.compression.finch import warn_uncalibrated
from stages.decoding.state import prefill_full
from stages.finch.heads import (
    HeadSet,
    all_heads,
    forget,
    model_fingerprint,
    save_heads,
    selecting_heads,
)
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
    cfg = heads_config(target_tokens=7, chunk_tokens=128, pool_window=7, mode=mode)
    trace: list[FinchStep] = []
    out = finch_prefill(model, [parts], cfg, 0, trace=trace, heads=PLANTED)
    assert out.context_tokens == [7]
    assert _kept(trace, 0, 7) == list(range(47, 54))


@pytest.mark.parametrize("mode", ["kv", "early_exit"])
def test_chunked_reading_keeps_the_window_and_batches_like_rows_alone(mode: str) -> None:
    model = planted_model()
    parts = [_parts(200, 150, seed=2), _parts(130, 20, seed=3), _parts(90, 60, seed=4)]
    cfg = heads_config(target_tokens=32, chunk_tokens=16, mode=mode)
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
    cfg = heads_config(target_tokens=24, chunk_tokens=32, mode="early_exit")
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
    cfg = heads_config(target_tokens=40, chunk_tokens=128, mode="kv")
    trace: list[FinchStep] = []
    finch_prefill(model, [parts], cfg, 0, trace=trace)
    assert set(range(47, 54)) <= set(_kept(trace, 0, 40))


def test_early_exit_needs_one_shared_selection() -> None:
    with pytest.raises(ValueError, match="early_exit"):
        heads_config(scoring="paper")
    with pytest.raises(ValueError, match="early_exit"):
        heads_config(head_mode="kv_group")
    heads_config(scoring="paper", mode="kv", head_mode="kv_group")


def test_max_scoring_layers_caps_the_layers_an_uncalibrated_model_reads(tmp_path, monkeypatch) -> None:
    """Uncalibrated, every head of every layer selects, so early exit reads the document
    through the whole model; capped at 1 layer it reads layer 0 only (where the planted
    head sits), still keeps the marker, and is exactly the run with every head of layer 0
    named as the calibrated set."""
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    model = planted_model()
    parts = [_parts(300, 200, seed=8), _parts(260, 40, seed=9)]
    base = {"target_tokens": 24, "chunk_tokens": 64, "mode": "early_exit", "keep": "tokens"}
    whole: list[FinchStep] = []
    finch_prefill(model, parts, heads_config(**base), 0, trace=whole)
    assert all(len(step.kept_index) == 2 for step in whole)  # both layers read every chunk
    capped: list[FinchStep] = []
    out = finch_prefill(model, parts, heads_config(**base, max_scoring_layers=1), 0, trace=capped)
    assert all(len(step.kept_index) == 1 for step in capped)  # layer 1 never read the document
    for row, at in enumerate([200, 40]):
        assert at in _kept(capped, row, 24)  # the planted head of layer 0 still finds its marker
    layer0: list[FinchStep] = []
    named = finch_prefill(model, parts, heads_config(**base), 0, trace=layer0,
                          heads=HeadSet("layer 0", "-", all_heads(model, 1)))
    assert [_kept(layer0, r, 24) for r in range(2)] == [_kept(capped, r, 24) for r in range(2)]
    assert torch.equal(out.state.last_logits, named.state.last_logits)


def test_selecting_heads_keeps_calibrated_heads_within_the_cap_or_every_head_of_those_layers() -> None:
    model = planted_model()  # 2 layers x 4 query heads
    deep = HeadSet("m", "-", ((1, 3), (0, 2), (1, 0)))
    assert selecting_heads(model, deep) == ((1, 3), (0, 2), (1, 0))
    assert selecting_heads(model, deep, 1) == ((0, 2),)  # the calibrated head within the cap
    assert selecting_heads(model, HeadSet("m", "-", ((1, 3),)), 1) == ((0, 0), (0, 1), (0, 2), (0, 3))
    assert selecting_heads(model, None, 1) == all_heads(model, 1)
    assert selecting_heads(model, None, 9) == selecting_heads(model, None) == all_heads(model)  # a cap past the depth


def test_max_scoring_layers_needs_shared_head_selection() -> None:
    with pytest.raises(ValueError, match="max_scoring_layers .* needs scoring heads and selection shared"):
        heads_config(mode="kv", scoring="paper", max_scoring_layers=4)
    with pytest.raises(ValueError, match="got scoring heads, selection per_layer"):
        heads_config(mode="kv", selection="per_layer", max_scoring_layers=4)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        heads_config(max_scoring_layers=0)
    assert heads_config(mode="kv", max_scoring_layers=4).max_scoring_layers == 4


def test_an_uncalibrated_model_is_named_once_at_load_with_what_it_costs(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    model = planted_model()
    with caplog.at_level(logging.WARNING, logger="stages.compression.finch"):
        assert warn_uncalibrated(model, "tiny", heads_config())
    [record] = caplog.records
    assert "tiny has no calibrated retrieval heads" in record.getMessage()
    assert "all 2 layers" in record.getMessage() and "max_scoring_layers" in record.getMessage()
    # Capped (the reading's cost is not paid) or calibrated: nothing to say. In mode kv every
    # layer is read anyway, but the choice is every head's vote: said, with that cost.
    assert not warn_uncalibrated(model, "tiny", heads_config(max_scoring_layers=1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stages.compression.finch"):
        assert warn_uncalibrated(model, "tiny", heads_config(mode="kv"))
    assert "every head's vote" in caplog.records[0].getMessage() and "calibrate-heads" in caplog.records[0].getMessage()
    save_heads(HeadSet("tiny", model_fingerprint(model), ((0, HEAD),)))
    forget(model)
    assert not warn_uncalibrated(model, "tiny", heads_config())
