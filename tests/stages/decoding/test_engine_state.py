"""The engine's learned state lives in one EngineState per actor, never in module globals."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import stages.decoding
from stages.decoding.adaptive import AcceptanceModel, StepCost
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full

NO_EOS = frozenset({-1})


def _learned(engine: EngineState) -> tuple:
    """The figures an engine state has learned: step-cost fit and acceptance counts."""
    c = engine.cost
    return (c.coefficients(), [row[:] for row in c._xtx], c._xty[:],
            [f[:] for f in engine.acceptance.first], [f[:] for f in engine.acceptance.cont])


def _run_pld(model, engine: EngineState, seed: int) -> int:
    """Greedy PLD with the model's own continuation as lookup (drafts accepted); returns accepted tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (6, 13)]
    plain = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS)
    runs = [r.tokens for r in decode_plain(model, prefill_full(model, prompts, 0), plain)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup",
                       num_draft_tokens=4, adaptive=False)
    out = decode(engine, prefill_full(model, prompts, 0), [p + r for p, r in zip(prompts, runs, strict=True)], cfg)
    return sum(r.accepted_tokens for r in out)


@pytest.fixture(scope="module")
def two_models(tiny_llama_factory):
    # Same class and the same (empty) name: a per-process table keyed by model name
    # and device, as the engine once had, would hand both the same figures.
    return tiny_llama_factory(3000, seed=1), tiny_llama_factory(3000, seed=2)


def test_two_engine_states_learn_independently(two_models):
    a_model, b_model = two_models
    a, b = EngineState(a_model), EngineState(b_model)
    fresh = _learned(EngineState(b_model))
    assert a.cost is not b.cost and a.acceptance is not b.acceptance and a.backend is not b.backend
    assert _run_pld(a_model, a, seed=1) > 0
    after_a = _learned(a)
    assert after_a != fresh  # a learned from its steps
    assert _learned(b) == fresh  # b saw none of it
    assert _run_pld(b_model, b, seed=2) > 0
    assert _learned(a) == after_a  # and a none of b's
    assert _learned(b) != fresh


def test_a_state_carries_what_it_learned_to_the_next_decode(tiny_model, tiny_engine):
    _run_pld(tiny_model, tiny_engine, seed=3)
    first = _learned(tiny_engine)
    _run_pld(tiny_model, tiny_engine, seed=4)
    second = _learned(tiny_engine)
    # The second call continued the fit (decayed sums grew from the first's), not restarted it.
    assert second != first and second[1][0][0] > first[1][0][0]


def _decoding_modules() -> list:
    return [importlib.import_module(f"stages.decoding.{m.name}") for m in pkgutil.iter_modules(stages.decoding.__path__)]


def _globals_snapshot() -> dict:
    """Per module global: containers by value, everything else by identity."""
    snap = {}
    for mod in _decoding_modules():
        for name, value in vars(mod).items():
            if isinstance(value, (dict, list, set, bytearray)):
                snap[(mod.__name__, name)] = (id(value), repr(value))
            elif not name.startswith("__"):
                snap[(mod.__name__, name)] = id(value)
    return snap


def test_decoding_leaves_module_globals_as_they_were(two_models):
    """Run the engine on two models: no global of stages.decoding is added, rebound or mutated,
    and no module holds learned objects."""
    before = _globals_snapshot()
    a_model, b_model = two_models
    _run_pld(a_model, EngineState(a_model), seed=5)
    _run_pld(b_model, EngineState(b_model), seed=6)
    assert _globals_snapshot() == before
    learned_types = (StepCost, AcceptanceModel, EngineState, torch.nn.Module, torch.Tensor)
    for mod in _decoding_modules():
        held = [n for n, v in vars(mod).items() if isinstance(v, learned_types)]
        assert not held, f"{mod.__name__} keeps {held} at module level"
