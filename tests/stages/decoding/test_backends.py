"""Step backends: the caller's model is never modified, the CPU kernel plan switch, the
shapes each backend gives a step, and decoding through the CPU backend (routed kernels
or stock) equals the reference decoder token for token."""

from __future__ import annotations

import pytest
import torch

from stages.decoding import backends, cpu_fused, linear_plan
from stages.decoding.adaptive import step_indicator
from stages.decoding.backends import CpuBackend, CudaBackend, StepBackend, backend_for, compile_plan
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.linear_plan import LinearPlan, RoutedLinear
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts

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


def _pld_run(engine_kwargs, model, prompts, runs):
    """Greedy PLD whose lookup holds the model's own continuation, so drafts get verified."""
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup",
                       num_draft_tokens=4, max_ngram=3, adaptive=False)
    eng = Engine(model, cfg, slots=3, expected_tokens=16, **engine_kwargs)
    reqs = [Request(i, PromptParts([], p, []), p + r) for i, (p, r) in enumerate(zip(prompts, runs, strict=True))]
    return eng, [o.result for o in eng.run(reqs)]


def test_the_callers_model_is_unchanged_during_and_after_decode(tiny_model, prompts_and_runs, monkeypatch):
    monkeypatch.setattr(backends, "plan_for", lambda *a: FORCED)
    before = _fingerprint(tiny_model)
    weight = tiny_model.model.layers[0].mlp.down_proj.weight.detach().clone()
    backend = backend_for(tiny_model)
    backend.warm_up()
    view = backend.view
    assert view is not tiny_model and any(type(m) is RoutedLinear for m in view.modules())
    # The view shares every weight (nothing copied), tied embeddings stay tied.
    assert all(a is b for a, b in zip(view.parameters(), tiny_model.parameters(), strict=True))
    assert view.get_output_embeddings().weight is view.get_input_embeddings().weight
    seen = []  # the caller's model as the view runs its steps
    hook = view.model.layers[0].register_forward_pre_hook(lambda *_: seen.append(_fingerprint(tiny_model)))
    prompts, runs = prompts_and_runs
    _, out = _pld_run({"backend": backend}, tiny_model, prompts, runs)
    hook.remove()
    assert seen and all(s == before for s in seen)
    assert _fingerprint(tiny_model) == before
    assert torch.equal(tiny_model.model.layers[0].mlp.down_proj.weight, weight)
    assert sum(r.accepted_tokens for r in out) > 0


@pytest.mark.parametrize("plan", [FORCED, None], ids=["routed", "stock"])
def test_cpu_backend_decode_equals_reference(tiny_model, prompts_and_runs, monkeypatch, plan):
    """Greedy PLD through the CPU backend (routed kernels or none) equals plain greedy on stock kernels."""
    monkeypatch.setattr(backends, "plan_for", lambda *a: plan)
    prompts, runs = prompts_and_runs
    eng, out = _pld_run({}, tiny_model, prompts, runs)
    assert isinstance(eng.backend, CpuBackend) and eng.backend.plan is plan
    assert [r.tokens for r in out] == runs
    assert sum(r.accepted_tokens for r in out) > 0  # drafts were verified through the backend


def test_shapes_exact_when_eager_bucketed_when_compiled(tiny_model):
    eager = StepBackend(tiny_model, torch.device("cpu"), compile="off")
    assert (eager.batch(3, 8), eager.width(5, 16), eager.span(300, 1024), eager.widths(16)) == (3, 5, 300, None)
    compiled = StepBackend(tiny_model, torch.device("cpu"), compile="inductor", min_span=256)
    assert compiled.batch(3, 8) == 4 and compiled.width(5, 16) == 8 and compiled.span(300, 1024) == 512
    assert compiled.widths(16) == (1, 4, 8, 17)
    assert isinstance(backend_for(tiny_model, "cpu"), CpuBackend)
    assert type(backend_for(tiny_model, "cpu", compile="inductor")) is StepBackend
    assert isinstance(backend_for(tiny_model, "meta"), StepBackend)
    assert CudaBackend.clock is not StepBackend.clock  # synchronises before reading the time


def test_plan_switch_and_cost_model(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear_plan, "_MIN_WEIGHT_BYTES", 0)  # let the tiny model get a plan
    on = backend_for(tiny_model)
    on.warm_up()
    assert on.plan is not None and len(list((tmp_path / "linear_plans").glob("*.json"))) == 1
    assert on.cost_shape(8) == on.plan.shape(8) and on.cost_prior() == (0.02, 0.67)
    assert "linear plan" in on.describe()
    # With the plan come the fused norms, activations and RoPE (where the kernels are built).
    fused = cpu_fused.status().startswith("kernel")
    assert on.fused == (4 * len(tiny_model.model.layers) + 1 if fused else 0)
    assert ("norms, activations and RoPE fused" in on.describe()) == fused
    monkeypatch.setenv("LONGDOC_LINEAR_PLAN", "0")
    off = backend_for(tiny_model)
    off.warm_up()
    assert off.plan is None
    assert not any(type(m) is RoutedLinear for m in off.view.modules())
    assert off.cost_shape(8) == step_indicator(8) and off.cost_prior() == (0.06, 0.7)
    assert "no plan" in off.describe() and off.fused == 0 and "norms, activations and RoPE torch ops" in off.describe()


def test_compile_choices_by_device():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_plan("auto", cpu) == (None, None) and compile_plan(None, cpu) == (None, None)
    assert compile_plan("auto", cuda) == (None, "cudagraphs")
    assert compile_plan("inductor", cuda) == ("reduce-overhead", "inductor")
    assert compile_plan(True, cpu) == (None, "inductor")
    assert compile_plan("cudagraphs", cuda) == (None, "cudagraphs")
    assert compile_plan("off", cuda) == (None, None)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        compile_plan("cudagraphs", cpu)
    with pytest.raises(ValueError, match="allowed: auto, inductor, cudagraphs, off"):
        compile_plan("fast", cpu)


def test_a_cpu_backend_without_a_compiler_says_so_once_and_runs(fresh_kernel, tiny_model, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level("WARNING", logger="stages.decoding.backends"):
        backend = CpuBackend(tiny_model)
        backend.warm_up()
        backend.warm_up()  # once: warm_up does its work once
    warnings = [r.getMessage() for r in caplog.records if r.name == "stages.decoding.backends"]
    assert len(warnings) == 1 and "no C compiler" in warnings[0] and "install gcc" in warnings[0]
    assert "SDPA" in backend.describe()  # the fallback it runs, on the description line
