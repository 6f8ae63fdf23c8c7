"""stages/finch/shared.py: a document read once for all its questions equals each
question read alone (kept entries, scores, logits and greedy text), in every mode."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import random_parts, tiny

from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.finch.config import FinchCompression
from stages.finch.prefill import FinchStep, finch_prefill, read_document
from stages.finch.shared import document_groups
from stages.prompting import PromptParts

MODES = {
    "paper-kv": {"scoring": "paper", "mode": "kv"},
    "heads-kv": {"scoring": "heads", "mode": "kv"},
    "heads-early_exit": {"scoring": "heads", "mode": "early_exit"},
}


def _questions(doc_len: int = 90, n: int = 3, seed: int = 4) -> list[PromptParts]:
    """One document (same prefix) asked ``n`` questions of different lengths, plus
    another document, interleaved."""
    a = random_parts([(6, doc_len, 5 + 2 * q) for q in range(n)], seed=seed)
    other = random_parts([(6, 57, 7)], seed=seed + 1)[0]
    same = [PromptParts(a[0].prefix_ids, a[0].context_ids, p.query_ids) for p in a]
    other = PromptParts(a[0].prefix_ids, other.context_ids, other.query_ids)
    return [same[0], other, *same[1:]]


def test_document_groups() -> None:
    parts = _questions()
    row_doc, doc_row = document_groups(parts)
    assert row_doc == [0, 1, 0, 0] and doc_row == [0, 1]


@pytest.mark.parametrize("context", [0, 24])
@pytest.mark.parametrize("mode", list(MODES))
def test_one_pass_equals_each_question_alone(mode: str, context: int) -> None:
    model = tiny("llama", seed=3)  # float64: no near-tie flips between batch layouts
    parts = _questions()
    cfg = FinchCompression(target_tokens=20, chunk_tokens=16, reading="chunk", chunk_context=context,
                           **MODES[mode])
    together = read_document(model, parts, cfg, 0)
    for row, p in enumerate(parts):
        alone = read_document(model, [p], cfg, 0)
        k = int(alone.kept[0])
        assert int(together.kept[row]) == k
        assert torch.equal(together.doc_index0[row][:, -k:], alone.doc_index0[0][:, -k:])
        if mode == "heads-early_exit":
            torch.testing.assert_close(together.kept_score[row][-k:], alone.kept_score[0][-k:])
    # The whole prefill: same logits and the same greedy answer, row by row.
    out = finch_prefill(model, parts, cfg, 0)
    for row, p in enumerate(parts):
        one = finch_prefill(model, [p], cfg, 0)
        torch.testing.assert_close(out.state.last_logits[row], one.state.last_logits[0])
        assert out.context_tokens[row] == one.context_tokens[0]
    greedy = DecodeConfig(max_new_tokens=6, eos_ids=frozenset({-1}))
    texts = [r.tokens for r in decode_plain(model, out.state, greedy)]
    assert texts == [decode_plain(model, finch_prefill(model, [p], cfg, 0).state, greedy)[0].tokens
                     for p in parts]


def test_questions_keep_their_own_entries() -> None:
    """Sharing the reading does not share the selection: questions keep different entries."""
    model = tiny("llama", seed=3)
    parts = _questions(doc_len=120)
    cfg = FinchCompression(target_tokens=12, chunk_tokens=16, reading="chunk", scoring="paper", mode="kv")
    read = read_document(model, parts, cfg, 0)
    kept = [read.doc_index0[r][0, -12:].tolist() for r in (0, 2, 3)]
    assert kept[0] != kept[1] or kept[1] != kept[2]


def test_document_read_once_and_memory_bounded() -> None:
    """The document pass reads each distinct document's chunk once; every row's cache stays
    within prefix + target + chunk + |P|."""
    model = tiny("llama", seed=3)
    parts = _questions(doc_len=100)
    cfg = FinchCompression(target_tokens=20, chunk_tokens=16, reading="chunk", scoring="heads",
                           mode="early_exit")
    fed: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, o: fed.append(int(a[0].shape[0])))
    trace: list[FinchStep] = []
    try:
        read_document(model, parts, cfg, 0, trace=trace)
    finally:
        hook.remove()
    # Per chunk: one document pass of G=2 rows, one question pass of B=4 rows (after the prefix pass).
    assert fed[0] == 2 and fed[1:] == [2, 4] * len(trace)
    lp, pmax = 6, max(len(p.query_ids) for p in parts)
    for step in trace:
        assert step.slots <= lp + cfg.target_tokens + cfg.chunk_tokens + pmax


def test_question_pass_stops_at_the_deepest_selecting_head_in_mode_kv(monkeypatch) -> None:
    """Heads scoring in mode kv: the document pass runs every layer (its entries are the
    answer's cache), the question pass only up to the deepest selecting head (P's entries are
    dropped), and the result equals a question pass through every layer."""
    from stages.finch import shared
    from stages.finch.heads import HeadSet

    model = tiny("llama", seed=3)
    assert len(model.model.layers) >= 2
    parts = _questions(doc_len=100)
    heads = HeadSet(model="tiny", fingerprint="-", heads=((0, 0), (0, 1)))
    cfg = FinchCompression(target_tokens=20, chunk_tokens=16, reading="chunk", scoring="heads", mode="kv")
    deep: list[int] = []
    hook = model.model.layers[-1].register_forward_hook(lambda m, a, o: deep.append(int(a[0].shape[0])))
    try:
        out = finch_prefill(model, parts, cfg, 0, heads=heads)
    finally:
        hook.remove()
    # The last layer sees the prefix pass and the document passes (G=2 rows) and the final
    # query prefill (B=4), never a question pass during the reading.
    chunks = -(-100 // 16)
    assert deep == [2] * (1 + chunks) + [4]
    every = shared.first_layers
    monkeypatch.setattr(shared, "first_layers", lambda base, n: every(base, len(base.layers)))
    full = finch_prefill(model, parts, cfg, 0, heads=heads)
    assert out.kept_positions == full.kept_positions
    torch.testing.assert_close(out.state.last_logits, full.state.last_logits)


@pytest.mark.parametrize("context", [8, 16, 40])
def test_chunk_context_reads_each_chunk_after_the_text_before_it(context: int) -> None:
    """chunk_context N: each chunk is read after the prefix and the entries of the document's
    last N tokens before it, as the passes before left them. Checked against plain model calls
    at the document's own positions on one cache cut back to [prefix | last N] after every
    chunk, with no rotation (deep-layer values compared: they depend on the context; keys
    differ from them only by the RoPE move). The prefix stays at the reading's distance by
    an empty prefix. Budget >= document, so every entry is kept and the final cache holds
    every chunk."""
    from transformers import DynamicCache

    model = tiny("llama", seed=3)
    p = random_parts([(0, 70, 5)], seed=8)[0]
    cfg = FinchCompression(target_tokens=128, chunk_tokens=16, reading="chunk", chunk_context=context,
                           scoring="paper", mode="kv")
    deep = read_document(model, [p], cfg, 0).cache.layers[-1].values[0]  # [Hkv, 70, D]
    cache = DynamicCache()
    for s in range(0, 70, 16):
        e = min(s + 16, 70)
        pos = torch.arange(s, e)[None]  # the document's own positions: RoPE sees distances only
        model(input_ids=torch.tensor([p.context_ids[s:e]]), position_ids=pos, past_key_values=cache, use_cache=True)
        torch.testing.assert_close(deep[:, s:e], cache.layers[-1].values[0][:, -(e - s):])
        held = min(context, cache.layers[0].keys.shape[2])
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, -held:], layer.values[:, :, -held:]
    # The reading without context is not that: the check can fail.
    bare = read_document(model, [p], cfg.model_copy(update={"chunk_context": 0}), 0)
    assert not torch.allclose(bare.cache.layers[-1].values[0][:, 16:32], deep[:, 16:32])


def test_chunk_context_needs_the_chunk_reading() -> None:
    with pytest.raises(ValueError, match="chunk_context"):
        FinchCompression(reading="kept", chunk_context=64)


def test_chunk_context_auto_is_one_chunk_where_the_kept_entries_are_the_cache() -> None:
    """auto: one chunk in mode kv (the kept entries are the answer's cache), none in early exit
    (select prefills the kept text again) or in the paper's reading; the fingerprint holds the
    tokens read before each chunk, so runs from before the option (none) keep their ids."""
    from stages.finch.config import SelectCompression

    kv = FinchCompression(reading="chunk", mode="kv", scoring="heads", chunk_tokens=256)
    assert kv.reading_context == 256 and kv.fingerprint_settings()["chunk_context"] == 256
    assert FinchCompression(reading="chunk", mode="kv", chunk_context=0).reading_context == 0
    for cfg in (FinchCompression(), FinchCompression(reading="chunk", mode="early_exit", scoring="heads"),
                SelectCompression(), FinchCompression(reading="chunk", mode="kv", chunk_context=0)):
        assert cfg.reading_context == 0 and "chunk_context" not in cfg.fingerprint_settings()
    assert SelectCompression(chunk_context=128).fingerprint_settings()["chunk_context"] == 128
