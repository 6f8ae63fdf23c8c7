"""CPU linear-kernel plan: calibration, routing (same products), caching, engine exactness."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from stages.decoding import engine, linear_plan
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.linear_plan import LinearPlan, calibrate, plan_for, routed_linears
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full

# Every small M routed to the transposed kernel, odd M padded with zero rows.
FORCED = LinearPlan(
    {m: ("wxt", m + (m % 2)) for m in range(1, 17)},
    {1: 1.0, 2: 1.1, 4: 1.2, 8: 2.0, 16: 3.0},
)


def test_routed_linears_compute_the_same_product(tiny_model):
    ids = torch.randint(3, 2000, (1, 3))
    calls = []
    with torch.inference_mode():
        stock = tiny_model(ids).logits
        with routed_linears(tiny_model, FORCED):
            lin = tiny_model.model.layers[0].mlp.down_proj
            assert "forward" in lin.__dict__
            handle = lin.register_forward_hook(lambda m, i, o: calls.append(o.shape))
            routed = tiny_model(ids).logits
            handle.remove()
        assert "forward" not in lin.__dict__  # restored on exit
    assert calls == [torch.Size([1, 3, 64])]  # M = 3 ran padded to 4, cut back to 3 rows
    torch.testing.assert_close(routed, stock, rtol=1e-5, atol=1e-5)


def test_plan_cost_interpolates_and_extends():
    assert FORCED.cost(2) == 1.1
    assert abs(FORCED.cost(6) - 1.6) < 1e-9  # between the probes at 4 and 8
    assert abs(FORCED.cost(32) - 5.0) < 1e-9  # past the last probe: the last slope
    assert FORCED.shape(1) == 0.0 and abs(FORCED.shape(8) - 1.0) < 1e-9
    again = LinearPlan.from_json(json.loads(json.dumps(FORCED.to_json())))
    assert again == FORCED


def test_calibrate_routes_every_small_m(tiny_model):
    plan = calibrate(tiny_model, max_m=8)
    assert sorted(plan.routes) == list(range(1, 9))
    for m, (kernel, padded) in plan.routes.items():
        assert kernel in ("xwt", "wxt") and m <= padded <= 8
        assert plan.times[m] > 0
    assert 64 in plan.times  # stock kernel probed past the routed range for the cost shape


def test_plan_for_skips_small_models_and_caches_on_disk(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear_plan, "_PLANS", {})
    assert plan_for(tiny_model, torch.device("cpu")) is None  # weights far below the threshold
    monkeypatch.setattr(linear_plan, "_MIN_WEIGHT_BYTES", 0)
    assert plan_for(tiny_model, torch.device("meta")) is None  # not a CPU
    plan = plan_for(tiny_model, torch.device("cpu"))
    assert plan is not None
    files = list((tmp_path / "linear_plans").glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(linear_plan, "_PLANS", {})  # a new process: read back, no new timing
    monkeypatch.setattr(linear_plan, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
    assert plan_for(tiny_model, torch.device("cpu")) == plan
    monkeypatch.setenv("LONGDOC_LINEAR_PLAN", "0")
    monkeypatch.setattr(linear_plan, "_PLANS", {})
    assert plan_for(tiny_model, torch.device("cpu")) is None


def test_engine_with_routed_kernels_is_exact(tiny_model, monkeypatch):
    """Greedy PLD through routed kernels equals plain greedy on stock kernels."""
    monkeypatch.setattr(engine, "_LEARNED", {})
    monkeypatch.setattr(engine, "plan_for", lambda model, device: FORCED)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 17, 9)]
    cfg0 = DecodeConfig(max_new_tokens=16, eos_ids=frozenset({-1}))
    runs = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg0)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=frozenset({-1}), speculative="prompt_lookup",
                       num_draft_tokens=4, max_ngram=3, adaptive=False)
    state = prefill_full(tiny_model, prompts, 0)
    ref = decode_plain(tiny_model, copy.deepcopy(state), cfg0)
    out = decode(tiny_model, state, [p + r for p, r in zip(prompts, runs, strict=True)], cfg)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    assert sum(r.accepted_tokens for r in out) > 0  # drafts were verified through routed kernels
