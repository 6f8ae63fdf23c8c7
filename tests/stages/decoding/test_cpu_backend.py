"""Step backends: the caller's model is never modified, the plan switch, and decoding
through a backend (routed kernels, eager) equals the reference decoder token for token."""

from __future__ import annotations

import copy

import pytest
import torch

from stages.decoding import cpu_backend, linear_plan
from stages.decoding.adaptive import step_indicator
from stages.decoding.backend import EagerBackend
from stages.decoding.config import DecodeConfig
from stages.decoding.cpu_backend import CpuBackend
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState, backend_for
from stages.decoding.linear_plan import LinearPlan, RoutedLinear
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full

# Every small M routed to the transposed kernel, odd M padded with zero rows.
FORCED = LinearPlan({m: ("wxt", m + (m % 2)) for m in range(1, 17)}, {1: 1.0, 2: 1.1, 4: 1.2, 8: 2.0, 16: 3.0})
NO_EOS = frozenset({-1})


def _fingerprint(model: torch.nn.Module) -> list:
    """Everything routing or attention swaps could change on a model, per module."""
    return [
        (name, type(m), id(m), "forward" in m.__dict__, tuple(id(p) for p in m.parameters(recurse=False)))
        for name, m in model.named_modules()
    ] + [model.config._attn_implementation]


@pytest.fixture(scope="module")
def prompts_and_runs(tiny_model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 17, 9)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS)
    runs = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)]
    return prompts, runs


def _pld(prompts, runs):
    """Greedy PLD whose lookup holds the model's own continuation, so drafts get verified."""
    lookup = [p + r for p, r in zip(prompts, runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup",
                       num_draft_tokens=4, max_ngram=3, adaptive=False)
    return lookup, cfg


def test_the_callers_model_is_unchanged_during_and_after_decode(tiny_model, prompts_and_runs, monkeypatch):
    monkeypatch.setattr(cpu_backend, "plan_for", lambda *a: FORCED)
    before = _fingerprint(tiny_model)
    weight = tiny_model.model.layers[0].mlp.down_proj.weight.detach().clone()
    engine = EngineState(tiny_model)
    view = engine.backend.view
    assert view is not tiny_model and any(type(m) is RoutedLinear for m in view.modules())
    # The view shares every weight (nothing copied), tied embeddings stay tied.
    assert all(a is b for a, b in zip(view.parameters(), tiny_model.parameters(), strict=True))
    assert view.get_output_embeddings().weight is view.get_input_embeddings().weight
    seen = []  # the caller's model as the view runs its steps
    hook = view.model.layers[0].register_forward_pre_hook(lambda *_: seen.append(_fingerprint(tiny_model)))
    prompts, runs = prompts_and_runs
    lookup, cfg = _pld(prompts, runs)
    out = decode(engine, prefill_full(tiny_model, prompts, 0), lookup, cfg)
    hook.remove()
    assert seen and all(s == before for s in seen)
    assert _fingerprint(tiny_model) == before
    assert torch.equal(tiny_model.model.layers[0].mlp.down_proj.weight, weight)
    assert sum(r.accepted_tokens for r in out) > 0


@pytest.mark.parametrize("plan", [FORCED, None], ids=["routed", "stock"])
def test_cpu_backend_decode_equals_reference(tiny_model, prompts_and_runs, monkeypatch, plan):
    """Greedy PLD through the CPU backend (routed kernels or none) equals plain greedy on stock kernels."""
    monkeypatch.setattr(cpu_backend, "plan_for", lambda *a: plan)
    prompts, runs = prompts_and_runs
    lookup, cfg = _pld(prompts, runs)
    state = prefill_full(tiny_model, prompts, 0)
    ref = decode_plain(tiny_model, copy.deepcopy(state), DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS))
    engine = EngineState(tiny_model)
    assert isinstance(engine.backend, CpuBackend) and engine.backend.plan is plan
    out = decode(engine, state, lookup, cfg)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    assert sum(r.accepted_tokens for r in out) > 0  # drafts were verified through the backend


def test_eager_backend_decode_equals_reference(tiny_model, prompts_and_runs):
    """The backend non-CPU devices get today, run on the CPU: same tokens as the reference."""
    prompts, runs = prompts_and_runs
    lookup, cfg = _pld(prompts, runs)
    state = prefill_full(tiny_model, prompts, 0)
    ref = decode_plain(tiny_model, copy.deepcopy(state), DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS))
    engine = EngineState(tiny_model, backend=EagerBackend(tiny_model, torch.device("cpu")))
    out = decode(engine, state, lookup, cfg)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    assert isinstance(backend_for(tiny_model, torch.device("meta")), EagerBackend)


def test_plan_switch_and_cost_model(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear_plan, "_MIN_WEIGHT_BYTES", 0)  # let the tiny model get a plan
    on = EngineState(tiny_model)
    plan = on.backend.plan
    assert plan is not None and len(list((tmp_path / "linear_plans").glob("*.json"))) == 1
    assert on.cost.shape(8) == plan.shape(8) and on.backend.cost_prior() == (0.02, 0.67)
    assert "linear plan" in on.describe()
    monkeypatch.setenv("LONGDOC_LINEAR_PLAN", "0")
    off = EngineState(tiny_model)
    assert off.backend.plan is None
    assert not any(type(m) is RoutedLinear for m in off.backend.view.modules())
    assert off.cost.shape(8) == step_indicator(8) and off.backend.cost_prior() == (0.06, 0.7)
    assert "no plan" in off.describe()
