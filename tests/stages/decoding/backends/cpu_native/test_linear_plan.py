"""The CPU linear plan (stages/decoding/backends/cpu_native/linear_plan.py): calibration,
routing (the same products), the disk cache, and the CPU-native backend routing its view."""

from __future__ import annotations

import json
import time

import pytest
import torch

from stages.decoding.backends.cpu_native import CpuNativeBackend, linear, linear_plan
from stages.decoding.backends.cpu_native.linear_plan import (
    LinearPlan,
    RoutedLinear,
    calibrate,
    plan_for,
    route_linears,
)
from stages.decoding.forward import decode_view

# Every small M routed to the transposed kernel, odd M padded with zero rows.
FORCED = LinearPlan(
    {m: ("wxt", m + (m % 2)) for m in range(1, 17)},
    {1: 1.0, 2: 1.1, 4: 1.2, 8: 2.0, 16: 3.0},
)


def test_routed_view_computes_the_same_product(tiny_model):
    ids = torch.randint(3, 2000, (1, 3), generator=torch.Generator().manual_seed(0))
    view = decode_view(tiny_model)
    assert route_linears(view, FORCED) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    lin = view.model.layers[0].mlp.down_proj
    assert type(lin) is RoutedLinear and lin.weight is tiny_model.model.layers[0].mlp.down_proj.weight
    calls = []
    handle = lin.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    with torch.inference_mode():
        stock = tiny_model(ids).logits
        routed = view(ids).logits
    handle.remove()
    assert calls == [torch.Size([1, 3, 64])]  # M = 3 ran padded to 4, cut back to 3 rows
    torch.testing.assert_close(routed, stock, rtol=1e-5, atol=1e-5)
    assert all(type(m) is not RoutedLinear for m in tiny_model.modules())  # only the view was routed


def test_plan_cost_interpolates_and_extends():
    assert FORCED.cost(2) == 1.1
    assert abs(FORCED.cost(6) - 1.6) < 1e-9  # between the probes at 4 and 8
    assert abs(FORCED.cost(32) - 5.0) < 1e-9  # past the last probe: the last slope
    assert FORCED.shape(1) == 0.0 and abs(FORCED.shape(8) - 1.0) < 1e-9
    assert LinearPlan.from_json(json.loads(json.dumps(FORCED.to_json()))) == FORCED
    assert FORCED.describe().startswith("1: wxt padded to 2, 2: wxt, 3: wxt padded to 4")


def test_calibrate_routes_every_small_m_and_leaves_the_global_rng_alone(tiny_model):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    plan = calibrate(tiny_model, time.thread_time, max_m=8)
    assert torch.equal(torch.get_rng_state(), before)
    assert set(range(1, 9)) <= set(plan.routes)
    for m, (kernel, padded) in plan.routes.items():
        if m <= 8:
            assert kernel in ("xwt", "wxt", "packed") and m <= padded <= 8
            assert plan.times[m] > 0
        else:  # past the small range only the packed kernel is routed, unpadded
            assert (kernel, padded) == ("packed", m) and m <= linear_plan.PACKED_MAX_M
    assert 64 in plan.times  # probed past the routed range for the cost shape


def test_plan_for_skips_small_models_and_caches_the_plan_on_disk(tiny_model, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    assert plan_for(tiny_model) is None  # weights far below the threshold
    monkeypatch.setattr(linear_plan, "MIN_WEIGHT_BYTES", 0)
    with caplog.at_level("WARNING", logger=linear_plan.__name__):
        plan = plan_for(tiny_model)
    assert plan is not None
    # A user waiting on a first run sees why (the progress line only says the model loads).
    assert "timing this CPU's linear kernels" in caplog.text and "once per machine and model" in caplog.text
    files = list((tmp_path / "linear_plans").glob("*.json"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    # The next asker (another actor, process or engine) reads it back: the same measured
    # times (a new calibration would time again and differ), the file not rewritten.
    caplog.clear()
    with caplog.at_level("WARNING", logger=linear_plan.__name__):
        assert plan_for(tiny_model) == plan and files[0].stat().st_mtime_ns == stamp
    assert "timing" not in caplog.text


def test_a_packed_plan_routes_through_packed_copies_and_computes_the_same_product(fresh_kernel, tiny_model):
    if not linear.available():
        pytest.skip(f"the packed kernel is not in use here: {linear.status()}")
    plan = LinearPlan({m: ("packed", m) for m in range(1, 65)}, {1: 1.0, 64: 2.0})
    ids = torch.randint(3, 2000, (2, 5), generator=torch.Generator().manual_seed(1))
    view = decode_view(tiny_model)
    route_linears(view, plan)
    lin = view.model.layers[0].self_attn.q_proj
    original = tiny_model.model.layers[0].self_attn.q_proj.weight
    assert lin.weight is original and lin.packed is not None and lin.packed.data_ptr() != original.data_ptr()
    with torch.inference_mode():
        stock = tiny_model(ids).logits
        routed = view(ids).logits  # M = 10 for every layer: the packed kernel
    torch.testing.assert_close(routed, stock, rtol=1e-5, atol=1e-5)
    assert plan.describe() == "1-64: packed"


def test_without_room_for_a_copy_the_packed_kernel_is_left_out(tiny_model):
    plan = calibrate(tiny_model, time.thread_time, max_m=4, ram_bytes=0)
    assert all(kernel != "packed" for kernel, _ in plan.routes.values())
    view = decode_view(tiny_model)
    route_linears(view, plan, ram_bytes=0)
    assert all(getattr(m, "packed", None) is None for m in view.modules())  # no copy made
    # A cached plan with packed routes, met where the copy does not fit: those M take the BLAS.
    cached = LinearPlan({m: ("packed", m) for m in range(1, 9)}, {1: 1.0, 8: 2.0})
    view = decode_view(tiny_model)
    route_linears(view, cached, ram_bytes=0)
    routed = [m for m in view.modules() if type(m) is RoutedLinear]
    assert routed and all(m.packed is None and not m.routes for m in routed)
    ids = torch.randint(3, 2000, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        torch.testing.assert_close(view(ids).logits, tiny_model(ids).logits)


def test_the_backend_routes_its_view_at_warm_up_and_fits_step_cost_to_the_plan(tiny_model, tmp_path, monkeypatch):
    """A model large enough for the plan: warm_up routes the backend's own view (never the
    caller's model), and the step-cost model takes the plan's measured shape."""
    if not CpuNativeBackend.claims(torch.device("cpu"), "off"):
        pytest.skip("the CPU-native backend does not run on this machine (no compiler or no AVX-512)")
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear_plan, "MIN_WEIGHT_BYTES", 0)
    backend = CpuNativeBackend(tiny_model)
    assert backend.plan is None and "no plan" in backend.describe()
    backend.warm_up()
    assert backend.plan is not None and "linear layers: plan {" in backend.describe()
    assert any(type(m) is RoutedLinear for m in backend.view.modules())
    assert all(type(m) is not RoutedLinear for m in tiny_model.modules())
    assert backend.cost_prior() == (0.02, 0.67) and backend.cost_shape(8) == backend.plan.shape(8)
