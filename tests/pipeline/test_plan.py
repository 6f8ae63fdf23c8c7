"""The plan's pieces: the column chain, how many batches a generate actor holds, what its actors ask Ray for."""

from __future__ import annotations

import pytest

from pipeline.plan import (
    ROWS_IN_FLIGHT,
    StageColumns,
    check_chain,
    generate_batches_in_flight,
    stage_chain,
)
from schemas.loading import spec_from_dict


def _spec(**resources):
    return spec_from_dict({"name": "p", "input": {"uri": "/unused"}, "resources": resources})


def test_an_actor_holds_enough_batches_to_keep_its_engine_full():
    # auto slots on CPU: 64 rows in flight -> 16 batches of 4, plus one waiting.
    assert generate_batches_in_flight(_spec(batch_size=4)) == ROWS_IN_FLIGHT["cpu"] // 4 + 1
    assert generate_batches_in_flight(_spec(batch_size=4, num_gpus=1)) == 64  # 256 rows: capped
    assert generate_batches_in_flight(_spec(batch_size=8, decode_slots=16)) == 3  # 2 batches + 1 waiting
    assert generate_batches_in_flight(_spec(batch_size=512)) == 2  # never fewer than 2


def test_the_chain_is_checked_before_anything_runs():
    check_chain(stage_chain(_spec()))
    with pytest.raises(ValueError, match="stage b needs columns \\['x'\\]"):
        check_chain([StageColumns("a", (), ("y",)), StageColumns("b", ("x",), ())])


def test_the_generate_actors_ask_for_the_specs_custom_resources(ray_session, tmp_path):
    # Without them a cluster places the actors on any node with CPUs: a spec pinning its
    # pool to labelled nodes (GPU pools, a node with the model's disk) was ignored.
    from pipeline.plan import build_plan

    spec = _spec(custom_resources={"oom_node": 1.5}, num_cpus=1)
    ds, _ = build_plan(spec, "r", "2026-01-01", str(tmp_path), frozenset(), [str(tmp_path / "d.txt")])
    op, args = ds._logical_plan.dag, {}
    while op is not None:  # walk back from the write stage to the generate stage
        if "GenerateStage" in op.name:
            args = op.ray_remote_args
        op = op.input_dependencies[0] if op.input_dependencies else None
    assert args.get("resources") == {"oom_node": 1.5} and args.get("num_cpus") == 1
