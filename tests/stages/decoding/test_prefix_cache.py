"""The prefix cache: its LRU budget, and the engine reusing a document's prefill across
its questions with the reference decoder's greedy output (fp32, tiny random Llama)."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import PREFIX_CACHE_SHARE, Engine
from stages.decoding.memory import KvBudget
from stages.decoding.prefix_cache import PrefixCache, kv_bytes
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.slots import SlotCache, bytes_per_token, layer_shapes_of
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts

NO_EOS = frozenset({-1})


def _kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(2, tokens, 4), torch.randn(2, tokens, 4)) for _ in range(layers)]


def test_least_recently_used_entries_leave_first_within_the_budget():
    one = kv_bytes(_kv(10))
    cache = PrefixCache(budget_bytes=2 * one)
    assert cache.put((1,), _kv(10)) and cache.put((2,), _kv(10))
    assert cache.get((1,)) is not None  # (1,) is now the most recently used
    assert cache.put((3,), _kv(10))  # evicts (2,)
    assert cache.get((2,)) is None and cache.get((1,)) is not None and cache.get((3,)) is not None
    assert len(cache) == 2 and cache.bytes_used == 2 * one <= cache.budget_bytes
    assert (cache.hits, cache.misses) == (3, 1) and cache.tokens_reused == 3  # keys of one token
    # An entry larger than the whole budget is refused and evicts nothing.
    assert not cache.put((4,), _kv(30))
    assert len(cache) == 2 and cache.get((4,)) is None
    # Storing a key again replaces its entry without counting it twice.
    assert cache.put((3,), _kv(10)) and cache.bytes_used == 2 * one


def test_a_slot_copied_out_and_in_is_the_same_row(tiny_model):
    cache = SlotCache.for_model(tiny_model, slots=2, capacity=32)
    for layer in cache.layers:
        layer.keys.normal_()
        layer.values.normal_()
    kv = cache.copy_out(0, 20)
    assert cache.copy_in(1, kv) == 20
    assert int(cache.length[1]) == 20 and int(cache.pos[1]) == 20
    for layer in cache.layers:
        assert torch.equal(layer.keys[1, :, :20], layer.keys[0, :, :20])
        assert torch.equal(layer.values[1, :, :20], layer.values[0, :, :20])
    with pytest.raises(ValueError, match="does not fit"):
        SlotCache.for_model(tiny_model, slots=1, capacity=8).copy_in(0, kv)


def _qa_parts(interleaved: bool = False) -> list[PromptParts]:
    """Three documents x three questions, in the order a QA job expands them, or
    interleaved (each document's questions apart: a slot a hit lands in held another
    document before, so a copy that missed a tensor would show)."""
    g = torch.Generator().manual_seed(3)
    prefix = [5, 6, 7, 8]
    parts = []
    for doc_len in (30, 12, 45):
        doc = torch.randint(10, 2000, (doc_len,), generator=g).tolist()
        for q_len in (3, 6, 4):
            parts.append(PromptParts(prefix, doc, torch.randint(10, 2000, (q_len,), generator=g).tolist()))
    return [parts[d * 3 + q] for q in range(3) for d in range(3)] if interleaved else parts


def _budget(model, tokens: int) -> KvBudget:
    per = bytes_per_token(layer_shapes_of(model), torch.float32)
    return KvBudget(per, tokens * per)


@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
@pytest.mark.parametrize(("slots", "chunk"), [(1, 2048), (3, 8)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_questions_on_one_document_reuse_its_prefill_with_the_reference_output(
    tiny_model, speculative, slots, chunk, interleaved
):
    parts = _qa_parts(interleaved)
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, speculative=speculative, num_draft_tokens=4,
                       adaptive=False)
    ref = decode_plain(tiny_model, prefill_full(tiny_model, [p.full_ids for p in parts], 0), cfg)
    eng = Engine(tiny_model, cfg, slots=slots, budget=_budget(tiny_model, 4096), expected_tokens=64,
                 chunk_tokens=chunk, prefix_cache=True)
    out = eng.run([Request(i, p, p.full_ids) for i, p in enumerate(parts)])
    assert [o.error for o in out] == [None] * len(parts)
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    # Each document is prefilled once: its second and third questions copy its prefix.
    assert eng.stats.prefix_hits == 6
    assert eng.stats.prefix_reused_tokens == 2 * sum(4 + n for n in (30, 12, 45))
    # Each row says what it took from the cache: its document's prefix on a hit, 0 on its first question.
    seen: set[int] = set()  # documents (by length: the three differ) already prefilled once
    for o, p in zip(out, parts, strict=True):
        assert o.result.cached_prompt_tokens == (4 + len(p.context_ids) if len(p.context_ids) in seen else 0)
        seen.add(len(p.context_ids))
    # A hit row's own prefill is its question alone: cheaper than its document's first row.
    first, hit = (out[2], out[8]) if interleaved else (out[6], out[7])
    assert hit.result.prefill_s < first.result.prefill_s
    assert "prefix cache" in eng.describe()


def test_the_cache_takes_its_share_of_the_kv_budget_and_an_oversized_prefix_is_not_stored(tiny_model):
    parts = _qa_parts()
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=NO_EOS)
    ref = decode_plain(tiny_model, prefill_full(tiny_model, [p.full_ids for p in parts], 0), cfg)
    budget = _budget(tiny_model, 4096)
    eng = Engine(tiny_model, cfg, budget=budget, expected_tokens=64, prefix_cache=True)
    assert eng.prefix_cache is not None
    assert eng.prefix_cache.budget_bytes + eng.budget.budget_bytes == budget.budget_bytes
    assert eng.prefix_cache.budget_bytes == int(budget.budget_bytes * PREFIX_CACHE_SHARE)
    # 2 KV tokens of room: no document's prefix fits, every request prefills it itself.
    eng.prefix_cache.budget_bytes = 2 * budget.bytes_per_token
    out = eng.run([Request(i, p, p.full_ids) for i, p in enumerate(parts)])
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    assert eng.stats.prefix_hits == 0 and len(eng.prefix_cache) == 0 and eng.prefix_cache.bytes_used == 0


def test_a_method_prefill_or_a_prompt_without_question_uses_no_cache(tiny_model):
    cfg = DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS)
    method = Engine(tiny_model, cfg, slots=2, expected_tokens=64, prefix_cache=True,
                    prefill=lambda parts: None)  # never called: only its presence matters here
    assert method.prefix_cache is None and "prefix cache" not in method.describe()
    eng = Engine(tiny_model, cfg, slots=2, expected_tokens=64, prefix_cache=True)
    whole = PromptParts([5, 6], [11, 12, 13, 14], [])  # nothing after the document: no split
    ref = decode_plain(tiny_model, prefill_full(tiny_model, [whole.full_ids] * 2, 0), cfg)
    out = eng.run([Request(i, whole, whole.full_ids) for i in range(2)])
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    assert eng.stats.prefix_hits == 0 and eng.prefix_cache is not None and eng.prefix_cache.misses == 0


def _first_logits(eng: Engine, requests: list[Request]) -> dict:
    """Each request's prefill logits [V] (what its first token is drawn from), by key."""
    seen: dict = {}
    join = eng._join

    def record(row, logits):
        seen[row.waiting.request.key] = logits[0].clone()
        return join(row, logits)

    eng._join = record  # type: ignore[method-assign]
    eng.run(requests)
    return seen


@pytest.mark.parametrize("chunk", [2048, 8])
def test_a_hit_row_reads_the_same_kv_as_if_it_had_prefilled_its_prefix_itself(tiny_model, chunk):
    # The tiny model's greedy tokens barely depend on the document, so the check is on the
    # logits: bitwise equal between a request that prefilled its document (miss) and the
    # same request after a sibling question stored it (hit, its slot last held another
    # document), and equal to an unsplit prefill's within fp32 rounding.
    parts = _qa_parts(interleaved=True)  # d1q1 d2q1 d3q1 d1q2 ...
    cfg = DecodeConfig(max_new_tokens=1, eos_ids=NO_EOS)
    target = parts[3]  # d1q2: a hit after d1q1
    with_siblings = _first_logits(
        Engine(tiny_model, cfg, slots=1, expected_tokens=64, chunk_tokens=chunk, prefix_cache=True),
        [Request(i, p, p.full_ids) for i, p in enumerate(parts[:4])],
    )
    alone = _first_logits(
        Engine(tiny_model, cfg, slots=1, expected_tokens=64, chunk_tokens=chunk, prefix_cache=True),
        [Request("alone", target, target.full_ids)],
    )
    assert torch.equal(with_siblings[3], alone["alone"])
    unsplit = prefill_full(tiny_model, [target.full_ids], 0).last_logits[0]
    torch.testing.assert_close(alone["alone"], unsplit, rtol=1e-5, atol=1e-5)
    other_doc = with_siblings[2]  # d3q1: another document's logits differ
    assert not torch.allclose(other_doc, alone["alone"], atol=1e-3)


def test_a_prompt_split_at_its_question_is_prefilled_in_one_iteration_where_the_budget_holds_it(tiny_model):
    # The part before the question (34 tokens) and the question (3) are two chunks; under a
    # budget of 64 tokens one iteration takes both, and the second request's two as well.
    parts = _qa_parts()[:2]  # one document, two questions: the second a hit
    eng = Engine(tiny_model, DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS), slots=2, expected_tokens=64,
                 chunk_tokens=64, prefix_cache=True)
    for i, p in enumerate(parts):
        eng.submit(Request(i, p, p.full_ids))
    eng.step()
    assert eng.activity() == "2 decoding (4 tokens), 0 prefilling, 0 queued"
    assert eng.stats.prefix_hits == 1 and eng.stats.steps == 1
