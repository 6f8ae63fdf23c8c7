"""The static-slot engine (continuous batching) against the reference and the dynamic engine.

fp32, tiny random Llama: greedy output must equal reference.decode_plain token for
token with and without prompt lookup, for mixed prompt lengths, rows finishing at
different steps, fewer slots than requests (slots refilled), compressed caches with
holes (Finch); a request must sample the same text in any batch (the chi-square
test of its distribution is in test_device_sampling.py).
"""

from __future__ import annotations

import pytest
import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.slot_engine import SlotEngine
from stages.decoding.state import prefill_full

NO_EOS = frozenset({-1})
LENGTHS = (3, 11, 26, 7, 40, 5, 17)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 2000, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def plain_runs(tiny_model, prompts) -> list[list[int]]:
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS)
    return [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)]


def _prefill(model, prompts, edit=None):
    def prefill(idx: list[int]):
        state = prefill_full(model, [prompts[i] for i in idx], 0)
        if edit is not None:
            edit(state, idx)
        return state

    return prefill


@pytest.mark.parametrize("slots", [1, 3, 8])
@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
@pytest.mark.parametrize("lookup_kind", ["prompt", "oracle"])
@pytest.mark.parametrize("min_span", [256, 8])  # 8: steps attend over spans of 8, 16, ... slots
def test_greedy_identical_to_reference(tiny_model, prompts, plain_runs, slots, speculative, lookup_kind, min_span):
    eos = plain_runs[1][4]  # ends row 1 early; others at other steps or the limit
    cfg = DecodeConfig(
        max_new_tokens=20, eos_ids=frozenset({eos}), speculative=speculative, num_draft_tokens=5, adaptive=False,
    )
    ref = decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)
    assert len({len(r.tokens) for r in ref}) > 1, "rows should finish at different steps"
    lookup = [p + r if lookup_kind == "oracle" else list(p) for p, r in zip(prompts, plain_runs, strict=True)]
    eng = SlotEngine(tiny_model, slots=slots, max_drafts=5, capacity=16, min_span=min_span)
    out, errors = eng.run(lookup, [0] * len(prompts), _prefill(tiny_model, prompts), cfg)
    assert errors == [None] * len(prompts)
    for a, b in zip(ref, out, strict=True):
        assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
    if slots < len(prompts):
        assert eng.stats.refills > 1 and eng.stats.max_active == slots
    assert eng.stats.grows >= 1  # capacity 16 is too small for the 40-token prompt
    if speculative == "prompt_lookup" and lookup_kind == "oracle":
        assert sum(r.accepted_tokens for r in out) > 0


def test_adaptive_drafting_keeps_greedy_output(tiny_model, prompts, plain_runs):
    noise = torch.Generator().manual_seed(7)
    # Half the rows look up their own continuation, half a scrambled one (rejections).
    lookup = [p + r if i % 2 else p + r[::-1] + torch.randint(3, 2000, (10,), generator=noise).tolist()
              for i, (p, r) in enumerate(zip(prompts, plain_runs, strict=True))]
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS, speculative="prompt_lookup", num_draft_tokens=8)
    eng = SlotEngine(tiny_model, slots=4, max_drafts=8)
    out, _ = eng.run(lookup, [0] * len(prompts), _prefill(tiny_model, prompts), cfg)
    assert [r.tokens for r in out] == plain_runs
    assert sum(r.draft_tokens - r.accepted_tokens for r in out) > 0  # rejections happened


def test_compressed_cache_with_holes(tiny_model, prompts, plain_runs):
    """A Finch-like cache: invalid slots mid-row and positions ahead of the slot count."""

    def punch(state, idx):
        with torch.inference_mode():
            for j, i in enumerate(idx):
                if i in (2, 4):
                    state.valid[j, -20:-12] = False

    def reference_state():
        state = prefill_full(tiny_model, prompts, 0)
        punch(state, list(range(len(prompts))))
        return state

    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, speculative="prompt_lookup", adaptive=False)
    ref = decode_plain(tiny_model, reference_state(), cfg)
    lookup = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    eng = SlotEngine(tiny_model, slots=3, max_drafts=8, min_span=8)
    out, _ = eng.run(lookup, [0] * len(prompts), _prefill(tiny_model, prompts, punch), cfg)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    assert [r.tokens for r in out] != plain_runs  # the holes changed what the rows see


@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
def test_a_request_samples_the_same_text_in_any_batch(tiny_model, prompts, plain_runs, speculative):
    """Uniforms keyed by (seed, position): slots, batch mates and admission order do not matter."""
    cfg = DecodeConfig(
        max_new_tokens=14, eos_ids=NO_EOS, temperature=0.9, top_p=0.8, speculative=speculative, num_draft_tokens=4,
    )
    seeds = [11 + i for i in range(len(prompts))]
    lookup = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    together, _ = SlotEngine(tiny_model, slots=3, max_drafts=4).run(lookup, seeds, _prefill(tiny_model, prompts), cfg)
    order = list(reversed(range(len(prompts))))
    rev = [prompts[i] for i in order]
    alone, _ = SlotEngine(tiny_model, slots=1, max_drafts=4).run(
        [lookup[i] for i in order], [seeds[i] for i in order], _prefill(tiny_model, rev), cfg
    )
    assert [r.tokens for r in together] == [alone[order.index(i)].tokens for i in range(len(prompts))]
    assert [r.tokens for r in together] != plain_runs[: len(prompts)]  # it did sample
    other, _ = SlotEngine(tiny_model, slots=3, max_drafts=4).run(lookup, [s + 1 for s in seeds],
                                                                  _prefill(tiny_model, prompts), cfg)
    assert [r.tokens for r in other] != [r.tokens for r in together]  # the seed matters


def test_a_failing_prefill_fails_only_its_request(tiny_model, prompts):
    broken = [list(p) for p in prompts]
    broken[3] = [10**9]  # out of vocabulary: its prefill raises
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=NO_EOS)
    eng = SlotEngine(tiny_model, slots=2)
    out, errors = eng.run(broken, [0] * len(broken), _prefill(tiny_model, broken), cfg)
    assert out[3] is None and isinstance(errors[3], IndexError)
    assert all(r is not None and len(r.tokens) == 6 for i, r in enumerate(out) if i != 3)
    assert [e is None for e in errors].count(True) == len(prompts) - 1


def test_stats_columns_consistent(tiny_model, prompts, plain_runs):
    lookup = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup", adaptive=False)
    out, _ = SlotEngine(tiny_model, slots=2).run(lookup, [0] * len(prompts), _prefill(tiny_model, prompts), cfg)
    for r in out:
        assert 0 <= r.accepted_tokens <= r.draft_tokens
        assert len(r.tokens) == 16 and len(r.tokens) <= 1 + r.decode_steps + r.accepted_tokens
        assert r.ttft_s > 0 and r.decode_s >= 0


def test_a_model_with_sliding_windows_is_refused(tiny_llama_factory):
    model = tiny_llama_factory(64, layer_types=["sliding_attention", "full_attention"])
    if not getattr(model.config, "layer_types", None) or "sliding_attention" not in model.config.layer_types:
        pytest.skip("this transformers version has no per-layer attention types for Llama")
    with pytest.raises(ValueError, match="full attention"):
        SlotEngine(model, slots=2)
