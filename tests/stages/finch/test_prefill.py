"""finch_prefill on tiny random models: equivalence, budgets, memory, batching, decoding."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import CONTEXT_VARIANTS, VARIANTS, random_parts, tiny

from stages.compression.finch import FinchCompression
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.finch.prefill import FinchStep, check_supported, finch_prefill

ROWS = [(7, 100, 9), (5, 37, 12), (7, 0, 4), (6, 64, 9)]  # (prefix, doc, query) lengths


@pytest.mark.parametrize("variant", CONTEXT_VARIANTS + ["heads-early_exit-chunk"])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_full_budget_equals_full_context_prefill(family: str, variant: str) -> None:
    """target >= every document: same next-token logits as one full prefill (fp32)."""
    model = tiny(family, dtype=torch.float32)
    parts = random_parts(ROWS, seed=1)
    cfg = FinchCompression(target_tokens=128, chunk_tokens=16, **VARIANTS[variant])
    out = finch_prefill(model, parts, cfg, 0)
    full = prefill_full(model, [p.full_ids for p in parts], 0)
    torch.testing.assert_close(out.state.last_logits, full.last_logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(out.state.next_pos, full.next_pos)
    assert out.context_tokens == [len(p.context_ids) for p in parts]
    assert len(out.compress_s) == len(parts) and out.state.prefill_s > 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_budget_exact_and_memory_bounded_beyond_context_window(variant: str) -> None:
    """Documents 2-3x the model's window: cache never exceeds prefix + target + chunk + |P|."""
    model = tiny("llama", dtype=torch.float32, max_position_embeddings=256)
    rows = [(7, 600, 9), (4, 750, 13), (7, 40, 5)]
    parts = random_parts(rows, seed=2)
    cfg = FinchCompression(target_tokens=64, chunk_tokens=32, **VARIANTS[variant])
    trace: list[FinchStep] = []
    out = finch_prefill(model, parts, cfg, 0, trace=trace)
    assert len(trace) == -(-750 // 32)
    lp, pmax = max(r[0] for r in rows), max(r[2] for r in rows)
    for step in trace:
        assert step.slots <= lp + cfg.target_tokens + cfg.chunk_tokens + pmax
        for (pre, _, q), n in zip(rows, step.row_slots, strict=True):
            assert n <= pre + cfg.target_tokens + cfg.chunk_tokens + q
        assert all(k <= cfg.target_tokens for k in step.kept)
    assert out.context_tokens == [64, 64, 40]
    assert trace[-1].kept == [64, 64, 40]
    # Kept entries are in document order, per layer and head, on every step.
    for layer in trace[-1].kept_index:
        for row, want in enumerate([64, 64, 40]):
            idx = layer[row][:, -want:]
            assert (idx >= 0).all() and (idx[:, 1:] > idx[:, :-1]).all()
    state = out.state
    assert state.valid.sum(dim=1).tolist() == [7 + 64 + 9, 4 + 64 + 13, 7 + 40 + 5]
    assert state.next_pos.tolist() == [7 + 64 + 9, 4 + 64 + 13, 7 + 40 + 5]
    assert int(state.next_pos.max()) < 256  # far inside the window after 750 tokens
    assert torch.isfinite(state.last_logits).all()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_batch_equals_rows_alone(variant: str) -> None:
    model = tiny("llama", seed=5)  # float64: no near-tie flips between batch layouts
    parts = random_parts(ROWS, seed=3)
    cfg = FinchCompression(target_tokens=24, chunk_tokens=16, **VARIANTS[variant])
    batch_trace: list[FinchStep] = []
    batch = finch_prefill(model, parts, cfg, 0, trace=batch_trace)
    for row, p in enumerate(parts):
        trace: list[FinchStep] = []
        alone = finch_prefill(model, [p], cfg, 0, trace=trace)
        torch.testing.assert_close(batch.state.last_logits[row], alone.state.last_logits[0])
        assert batch.context_tokens[row] == alone.context_tokens[0]
        kept = alone.context_tokens[0]
        if not trace:  # empty document: no chunk passes
            continue
        for lb, la in zip(batch_trace[-1].kept_index, trace[-1].kept_index, strict=True):
            assert torch.equal(lb[row][:, lb.shape[-1] - kept :], la[0][:, la.shape[-1] - kept :])
    if "kv_group" in variant:  # heads really keep different entries
        layer = batch_trace[-1].kept_index[1][0]
        assert not torch.equal(layer[0], layer[1])


def test_decoding_from_finch_state() -> None:
    model = tiny("llama", dtype=torch.float32)
    parts = random_parts(ROWS, seed=4)
    config = DecodeConfig(max_new_tokens=6, eos_ids=frozenset({-1}))
    full = decode_plain(model, prefill_full(model, [p.full_ids for p in parts], 0), config)
    kept_all = finch_prefill(model, parts, FinchCompression(target_tokens=128, chunk_tokens=16), 0)
    same = decode_plain(model, kept_all.state, config)
    assert [r.tokens for r in same] == [r.tokens for r in full]
    compressed = finch_prefill(model, parts, FinchCompression(target_tokens=8, chunk_tokens=16), 0)
    before = compressed.state.valid.shape[1]
    res = decode_plain(model, compressed.state, config)
    assert [len(r.tokens) for r in res] == [6] * len(parts)
    assert compressed.state.cache.layers[0].keys.shape[2] == before + 5  # grew by the decode steps


@pytest.mark.parametrize(
    ("family", "dtype"),
    [("mistral", torch.float32), ("qwen2", torch.float32), ("llama", torch.bfloat16)],
)
def test_other_families_and_bf16_compress(family: str, dtype: torch.dtype) -> None:
    model = tiny(family, dtype=dtype)
    parts = random_parts([(5, 90, 7), (3, 20, 6)], seed=6)
    out = finch_prefill(model, parts, FinchCompression(target_tokens=30, chunk_tokens=16), 0)
    assert out.context_tokens == [30, 20]
    assert torch.isfinite(out.state.last_logits).all()


def test_unsupported_architectures_raise() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="GPT2"):
        check_supported(gpt2)
    opt = OPTForCausalLM(OPTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                   ffn_dim=64, vocab_size=64, word_embed_proj_dim=32))
    with pytest.raises(ValueError, match="OPT"):
        finch_prefill(opt, random_parts([(2, 10, 2)]), FinchCompression(), 0)


def test_bad_inputs_raise() -> None:
    model = tiny("llama", dtype=torch.float32, max_position_embeddings=64)
    with pytest.raises(ValueError, match="context window 64"):
        finch_prefill(model, random_parts([(4, 500, 4)]), FinchCompression(target_tokens=48, chunk_tokens=32), 0)
    with pytest.raises(ValueError, match="query_ids"):
        finch_prefill(model, random_parts([(4, 10, 0)]), FinchCompression(target_tokens=8, chunk_tokens=16), 0)


@pytest.mark.parametrize("variant", ["heads-shared-kv", "paper-sum"])
def test_on_chunk_runs_between_passes_and_changes_nothing(variant: str) -> None:
    """The decode engine's hook: called once per chunk pass, the result as without it."""
    model = tiny("llama", seed=2)
    parts = random_parts(ROWS, seed=6)
    cfg = FinchCompression(target_tokens=24, chunk_tokens=16, **VARIANTS[variant])
    calls: list[int] = []
    trace: list[FinchStep] = []
    hooked = finch_prefill(model, parts, cfg, 0, trace=trace, on_chunk=lambda: calls.append(1))
    plain = finch_prefill(model, parts, cfg, 0)
    assert len(calls) == len(trace) > 1
    torch.testing.assert_close(hooked.state.last_logits, plain.state.last_logits)
    assert hooked.context_tokens == plain.context_tokens


def test_kv_tokens_is_the_prompt_with_at_most_the_budget() -> None:
    """What the engine admits a Finch row by: prefix + min(target, doc) + query, an upper
    bound of the KV entries its prefill leaves."""
    from schemas.spec import JobSpec
    from stages.compression import registry

    job = JobSpec.model_validate({"name": "k", "input": {"uri": "/tmp/x"}, "output": {"uri": "/tmp/y"},
                                  "task": {"kind": "qa", "questions": ["q?"]},
                                  "compression": {"method": "finch", "target_tokens": 24, "chunk_tokens": 16}})
    method = registry()["finch"]
    short, long_ = random_parts([(3, 10, 4), (3, 100, 4)], seed=1)
    assert method.kv_tokens(job, short) == 3 + 10 + 4
    assert method.kv_tokens(job, long_) == 3 + 24 + 4
    model = tiny("llama", seed=2)
    out = finch_prefill(model, [long_], FinchCompression(target_tokens=24, chunk_tokens=16), 0)
    assert int(out.state.valid[0].sum()) <= method.kv_tokens(job, long_)


def _sentenced_parts(rows: list[tuple[int, int, int]], seed: int):
    """random_parts whose documents end a sentence (token 3, a break) every 5-11 tokens."""
    from stages.finch.spans import Boundaries

    parts = random_parts(rows, seed=seed)
    g = torch.Generator().manual_seed(seed)
    for p in parts:
        i = 0
        while True:
            i += int(torch.randint(5, 12, (1,), generator=g))
            if i >= len(p.context_ids):
                break
            p.context_ids[i] = 3
    return parts, Boundaries(breaks=frozenset({3}), ends=frozenset(), opens=frozenset())


@pytest.mark.parametrize("reading", ["kept", "chunk"])
def test_kv_sentences_keep_whole_sentences_exactly_within_the_budget(reading: str) -> None:
    """keep sentences in mode kv: the same exact budget, batch equals rows alone, and the
    kept entries cover whole sentences where the token selection cuts many."""
    from stages.finch.spans import sentence_spans

    model = tiny("llama", seed=5)
    parts, bounds = _sentenced_parts([(5, 300, 6), (4, 180, 8)], seed=4)
    base = {"scoring": "heads", "mode": "kv", "reading": reading, "target_tokens": 40, "chunk_tokens": 32}
    sent = finch_prefill(model, parts, FinchCompression(keep="sentences", **base), 0, boundaries=bounds)
    tokens = finch_prefill(model, parts, FinchCompression(keep="tokens", **base), 0)
    assert sent.context_tokens == tokens.context_tokens == [40, 40]
    for row, p in enumerate(parts):
        alone = finch_prefill(model, [p], FinchCompression(keep="sentences", **base), 0, boundaries=bounds)
        assert alone.kept_positions == [sent.kept_positions[row]]
        torch.testing.assert_close(alone.state.last_logits[0], sent.state.last_logits[row])
        spans = sentence_spans(p.context_ids, bounds)

        def cut(kept: list[int], spans=spans) -> int:
            """Sentences of which some, not all, entries are kept."""
            have = set(kept)
            return sum(0 < len(have & set(range(a, e))) < e - a for a, e in spans)

        # A pass's budget, or a chunk's edge, may cut a sentence; the tokens scatter over many.
        assert 2 * cut(sent.kept_positions[row]) <= cut(tokens.kept_positions[row])
    with pytest.raises(ValueError, match="boundaries"):
        finch_prefill(model, parts, FinchCompression(keep="sentences", **base), 0)



@pytest.mark.parametrize("reading", ["kept", "chunk"])
def test_kv_sentences_relevance_floor_drops_whole_weak_sentences_from_the_cache(reading: str) -> None:
    """min_relevance with keep sentences in mode kv: after the last pass the answer's cache
    keeps only the kept sentences near the best one's score: fewer entries than the budget,
    a subset of the budget's entries, no sentence cut that the budget left whole, a document
    within the budget kept whole, batch equal to rows alone, and decoding runs from it."""
    from stages.finch.spans import sentence_spans

    model = tiny("llama", seed=5)
    parts, bounds = _sentenced_parts([(5, 300, 6), (4, 180, 8), (6, 30, 5)], seed=4)
    base = {"scoring": "heads", "mode": "kv", "reading": reading, "target_tokens": 40, "chunk_tokens": 32,
            "keep": "sentences", "next_sentence": False}
    full = finch_prefill(model, parts, FinchCompression(**base), 0, boundaries=bounds)
    # A random tiny model's sentence scores are nearly flat: the lowest of these floors that
    # drops a sentence in both long rows (one of them must).
    for floor in (0.9, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999):
        floored = finch_prefill(model, parts, FinchCompression(min_relevance=floor, **base), 0, boundaries=bounds)
        if max(floored.context_tokens[:2]) < 40:
            break
    assert full.context_tokens == [40, 40, 30]
    assert floored.context_tokens[2] == 30  # the short document fits the budget: read whole
    assert all(0 < n < 40 for n in floored.context_tokens[:2])
    for row, p in enumerate(parts):
        kept, budget = floored.kept_positions[row], full.kept_positions[row]
        assert set(kept) <= set(budget)
        assert int(floored.state.valid[row].sum()) == int(full.state.valid[row].sum()) - (len(budget) - len(kept))
        spans = sentence_spans(p.context_ids, bounds)
        # Every sentence the budget kept whole is kept whole or dropped whole.
        for a, e in spans:
            whole = set(range(a, e)) <= set(budget)
            assert not whole or len(set(range(a, e)) & set(kept)) in (0, e - a)
        alone = finch_prefill(model, [p], FinchCompression(min_relevance=floor, **base), 0, boundaries=bounds)
        assert alone.kept_positions == [kept]
        torch.testing.assert_close(alone.state.last_logits[0], floored.state.last_logits[row])
    out = decode_plain(model, floored.state, DecodeConfig(max_new_tokens=4, eos_ids=frozenset({-1})))
    assert [len(r.tokens) for r in out] == [4, 4, 4]
    # next_sentence: the kept sentence right after each one above the floor stays too.
    base["next_sentence"] = True
    more = finch_prefill(model, parts, FinchCompression(min_relevance=floor, **base), 0, boundaries=bounds)
    for row, p in enumerate(parts[:2]):
        spans = sentence_spans(p.context_ids, bounds)
        of = {j: n for n, (a, e) in enumerate(spans) for j in range(a, e)}
        above = {of[j] for j in floored.kept_positions[row]}
        want = {j for j in full.kept_positions[row] if of[j] in above or of[j] - 1 in above}
        assert set(more.kept_positions[row]) == want
    assert sum(more.context_tokens[:2]) > sum(floored.context_tokens[:2])  # some sentence followed one
