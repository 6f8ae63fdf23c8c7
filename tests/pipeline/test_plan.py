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


def _with(method: str, **resources):
    return spec_from_dict({"name": "p", "input": {"uri": "/unused"}, "compression": {"method": method},
                           "resources": resources})


def test_the_model_stages_are_declared_once_with_their_batches_and_resources():
    """The list both runners fold (the Ray plan: a pool per stage; local_plan.py: one instance each)."""
    from pipeline.plan import TEXT_BATCH, model_stages

    stages = model_stages(_spec(batch_size=8, num_cpus=2, custom_resources={"disk": 1}))
    assert [s.name for s in stages] == ["tokenize", "generate"]
    tok, gen = stages
    assert tok.batch_size == TEXT_BATCH and tok.num_gpus == 0
    assert gen.batch_size == 8 and gen.in_flight == generate_batches_in_flight(_spec(batch_size=8, num_cpus=2))
    assert gen.needs() == {"CPU": 2.0, "disk": 1.0}
    rag = model_stages(_with("rag", compress_num_gpus=1, num_gpus=1))
    assert [s.name for s in rag] == ["tokenize", "compression 'rag'", "generate"]
    assert rag[1].needs()["GPU"] == 1.0 and rag[1].gpu_field == "resources.compress_num_gpus"
    assert rag[2].needs()["GPU"] == 1.0 and rag[2].gpu_field == "resources.num_gpus"


def test_one_fit_check_refuses_a_stage_asking_for_gpus_this_machine_lacks(monkeypatch):
    import torch

    from pipeline.placement import check_fits

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    check_fits(_spec(), "local")  # CPU only: fits
    with pytest.raises(ValueError, match=r"resources.num_gpus: 1 GPU\(s\) asked; this machine has 0"):
        check_fits(_spec(num_gpus=1), "local")
    with pytest.raises(ValueError, match=r"resources.compress_num_gpus: 1 GPU\(s\) asked"):
        check_fits(_with("rag", compress_num_gpus=1), "local")
