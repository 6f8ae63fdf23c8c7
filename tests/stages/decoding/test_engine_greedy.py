"""The engine against reference.decode_plain on a tiny random Llama: greedy output must
be identical token for token, for ragged left-padded batches, with and without
speculation, whatever the drafts and however the cache gets holes."""

from __future__ import annotations

import copy

import pytest
import torch

from schemas.output import mean_accepted_per_step
from stages.decoding import engine
from stages.decoding.adaptive import Tuning
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full

NO_EOS = frozenset({-1})


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (3, 11, 26, 7)]


@pytest.fixture(scope="module")
def greedy_runs(tiny_model, prompts):
    """Plain greedy continuations (no EOS) and an EOS id that ends rows at different steps."""
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS)
    runs = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)]
    eos = runs[1][4]  # row 1 ends at step <= 4; rows that never emit it run to the limit
    return runs, eos


def _both(model, prompts, lookup, cfg, tuning=None, edit=None):
    state = prefill_full(model, prompts, 0)
    if edit is not None:
        edit(state)
    ref = decode_plain(model, copy.deepcopy(state), cfg)
    out = decode(EngineState(model), state, lookup, cfg, tuning=tuning)
    return ref, out


@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("lookup_kind", ["prompt", "oracle"])
def test_greedy_identical_to_reference(tiny_model, prompts, greedy_runs, speculative, adaptive, lookup_kind):
    runs, eos = greedy_runs
    # "oracle": the lookup source holds the model's own continuation, so drafts get accepted.
    lookup = [p + r if lookup_kind == "oracle" else list(p) for p, r in zip(prompts, runs, strict=True)]
    cfg = DecodeConfig(
        max_new_tokens=20, eos_ids=frozenset({eos}), speculative=speculative,
        num_draft_tokens=5, max_ngram=3, adaptive=adaptive,
    )
    ref, out = _both(tiny_model, prompts, lookup, cfg)
    assert len({len(r.tokens) for r in ref}) > 1, "rows should finish at different steps"
    for a, b in zip(ref, out, strict=True):
        assert b.tokens == a.tokens
        assert b.finish_reason == a.finish_reason
        assert len(b.tokens) <= cfg.max_new_tokens
    if speculative == "prompt_lookup" and lookup_kind == "oracle" and not adaptive:
        assert sum(r.accepted_tokens for r in out) > 0


@pytest.mark.parametrize("max_new", [1, 2, 5])
def test_max_new_tokens_never_exceeded(tiny_model, prompts, greedy_runs, max_new):
    runs, _ = greedy_runs
    lookup = [p + r for p, r in zip(prompts, runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_ids=NO_EOS, speculative="prompt_lookup",
                       num_draft_tokens=8, adaptive=False)
    ref, out = _both(tiny_model, prompts, lookup, cfg)
    for a, b in zip(ref, out, strict=True):
        assert b.tokens == a.tokens and len(b.tokens) == max_new
        assert b.finish_reason == "length"


def test_holes_compaction_and_row_exits(tiny_model, prompts, greedy_runs, monkeypatch):
    """Wrong drafts everywhere (rejections leave holes), compaction at every chance."""
    runs, eos = greedy_runs
    calls = []
    real = engine.compact
    monkeypatch.setattr(engine, "compact", lambda c, v: calls.append(1) or real(c, v))
    noise = torch.Generator().manual_seed(7)
    # Rows 0 and 3 look up their own continuation (drafts accepted); rows 1 and 2 (the
    # longest) a scrambled one (drafts rejected), so the cache gets holes mid-way.
    lookup = [p + r if i in (0, 3) else p + r[::-1] + torch.randint(3, 2000, (10,), generator=noise).tolist()
              for i, (p, r) in enumerate(zip(prompts, runs, strict=True))]
    cfg = DecodeConfig(max_new_tokens=20, eos_ids=frozenset({eos}), speculative="prompt_lookup",
                       num_draft_tokens=4, adaptive=False)
    ref, out = _both(tiny_model, prompts, lookup, cfg, tuning=Tuning(compact_min_holes=1, compact_fraction=0.0))
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    assert calls, "compaction never ran"
    assert sum(r.draft_tokens - r.accepted_tokens for r in out) > 0


def test_prefill_state_with_holes(tiny_model, prompts, greedy_runs):
    """A compressed cache (Finch) has invalid slots in the middle of a row."""
    runs, _ = greedy_runs

    def punch(state):
        with torch.inference_mode():
            state.valid[2, 3:9] = False
            state.valid[1, -5:-3] = False

    lookup = [p + r for p, r in zip(prompts, runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, speculative="prompt_lookup", adaptive=False)
    ref, out = _both(tiny_model, prompts, lookup, cfg, edit=punch)
    assert [r.tokens for r in out] == [r.tokens for r in ref]


@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
def test_stats_columns_consistent(tiny_model, tiny_engine, prompts, greedy_runs, speculative):
    runs, _ = greedy_runs
    lookup = [p + r for p, r in zip(prompts, runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative=speculative, adaptive=False)
    state = prefill_full(tiny_model, prompts, 0)
    out = decode(tiny_engine, state, lookup, cfg)
    for r in out:
        assert 0 <= r.accepted_tokens <= r.draft_tokens
        assert r.ttft_s >= state.prefill_s and r.decode_s >= 0.0
        # Each step emits accepted + 1 tokens; the last step may be cut by the limit.
        assert len(r.tokens) <= 1 + r.decode_steps + r.accepted_tokens
        assert len(r.tokens) > r.decode_steps
        if speculative == "none":
            assert r.draft_tokens == 0 and r.decode_steps == len(r.tokens) - 1
    if speculative == "prompt_lookup":
        assert all(mean_accepted_per_step(len(r.tokens), r.decode_steps) > 1.0 for r in out)


def test_plain_sampling_matches_reference_seed_for_seed(tiny_model, tiny_engine, prompts):
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, temperature=0.9, top_p=0.8)
    state = prefill_full(tiny_model, prompts, 0)
    ref = decode_plain(tiny_model, copy.deepcopy(state), cfg, seeds=[5, 6, 7, 8])
    out = decode(tiny_engine, state, [list(p) for p in prompts], cfg, seeds=[5, 6, 7, 8])
    assert [r.tokens for r in out] == [r.tokens for r in ref]


def test_bad_arguments_raise(tiny_model, tiny_engine, prompts):
    state = prefill_full(tiny_model, prompts, 0)
    cfg = DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS)
    with pytest.raises(ValueError, match="lookup_ids"):
        decode(tiny_engine, state, [[1]], cfg)
    with pytest.raises(ValueError, match="speculative"):
        decode(tiny_engine, state, prompts, DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS, speculative="medusa"))
    with pytest.raises(ValueError, match="engine state on meta"):
        decode(EngineState(tiny_model, torch.device("meta")), state, prompts, cfg)
