"""Eval runs and their specs: which runs, override scoping, spec validity, question meta."""

from __future__ import annotations

import json

import pytest

from pipeline.eval.specs import (
    BUDGETED,
    EvalRun,
    build_eval_spec,
    load_question_meta,
    plan_runs,
    split_overrides,
)
from schemas.loading import SpecError
from stages.compression import registry
from stages.compression.rag import RagCompression
from stages.compression.truncate import TruncateCompression


def test_plan_runs_defaults_and_budgets() -> None:
    runs = [r.tag for r in plan_runs(None, [512, 1024], None)]
    core = ("none", "truncate", "rag", "finch")
    assert [r for r in runs if r.split("-")[0] in core] == [
        "none-full", "truncate-512", "truncate-1024", "rag-512", "rag-1024", "finch-512", "finch-1024",
    ]  # fmt: skip
    # Every method of the registry (stages/compression/) runs by default, budgeted ones per budget.
    budgeted = [m.name for m in registry().values() if m.eval_budgeted]
    assert budgeted == list(BUDGETED) and "autocompressor" not in BUDGETED
    assert sorted(runs) == sorted(
        [f"{m}-{b}" for m in budgeted for b in (512, 1024)]
        + [f"{m}-full" for m, d in registry().items() if m not in budgeted and not d.needs_checkpoint]
    )
    with_ac = plan_runs(None, [512], "ckpt")
    assert EvalRun("autocompressor", None) in with_ac and EvalRun("autocompressor", None) not in plan_runs(
        None, [512], None
    )
    assert [r.tag for r in plan_runs(["rag,none", "rag"], [64], None)] == ["rag-64", "none-full"]
    # named without --autocompressor: its settings' default checkpoint (shipped per model)
    assert plan_runs(["autocompressor"], [64], None) == [EvalRun("autocompressor", None)]


@pytest.mark.parametrize(
    ("methods", "budgets", "ac", "match"),
    [
        (["zip"], [512], None, "unknown method"),
        (["rag"], [0], None, "target-tokens"),
        (["rag"], [], None, "target-tokens"),
    ],
)
def test_plan_runs_rejects_bad_values(methods, budgets, ac, match) -> None:
    with pytest.raises(ValueError, match=match):
        plan_runs(methods, budgets, ac)


def test_split_overrides_scopes_per_method() -> None:
    common, scoped = split_overrides(
        ["generation.model=/m", "rag:compression.chunk_tokens=64", "resources.batch_size=2"],
        {"rag", "truncate"},
    )
    assert common == ["generation.model=/m", "resources.batch_size=2"]
    assert scoped == {"rag": ["compression.chunk_tokens=64"]}
    with pytest.raises(ValueError, match="scope compression"):
        split_overrides(["compression.chunk_tokens=64"], {"rag"})
    with pytest.raises(ValueError, match="finch"):
        split_overrides(["finch:compression.chunk_tokens=64"], {"rag"})


def test_build_eval_spec_per_method(tmp_path) -> None:
    kw = dict(max_new_tokens=8, limit=2, overrides=["generation.seed=3"])
    rag = build_eval_spec(EvalRun("rag", 256), "/e.jsonl", str(tmp_path / "r"), **kw)
    assert isinstance(rag.compression, RagCompression) and rag.compression.target_tokens == 256
    assert rag.task.kind == "qa" and rag.input.question_field == "questions"
    assert rag.input.answer_field == "answers" and rag.input.limit == 2
    assert rag.output.uri == str(tmp_path / "r") and rag.generation.seed == 3
    trunc = build_eval_spec(EvalRun("truncate", 64), "/e.jsonl", "o", **kw)
    assert isinstance(trunc.compression, TruncateCompression)
    none = build_eval_spec(EvalRun("none", None), "/e.jsonl", "o", **kw)
    assert none.compression.method == "none" and none.name == "eval-none-full"
    ac = build_eval_spec(
        EvalRun("autocompressor", None), "/e.jsonl", "o", autocompressor="/ck", **kw
    )
    assert ac.compression.checkpoint == "/ck"
    shipped = build_eval_spec(EvalRun("autocompressor", None), "/e.jsonl", "o", **kw)
    assert shipped.compression.checkpoint is None  # the method resolves its shipped default
    assert none.resources.num_cpus == "auto"  # resolved by the run (pipeline.placement.with_actor_cpus)
    mine = build_eval_spec(EvalRun("none", None), "/e.jsonl", "o", max_new_tokens=8, limit=None,
                           overrides=["resources.num_cpus=1.5"])
    assert mine.resources.num_cpus == 1.5  # the user's override wins
    with pytest.raises(SpecError, match="max_new_tokens"):
        build_eval_spec(
            EvalRun("rag", 8), "/e.jsonl", "o", max_new_tokens=0, limit=None, overrides=[]
        )


def test_load_question_meta(tmp_path) -> None:
    p = tmp_path / "e.jsonl"
    recs = [
        {"id": "a", "text": "t", "questions": ["q1", "q2"], "answers": ["x", "y"],
         "depths": [0.1, 0.9], "kind": ["inserted", "native"], "style": ["echoed", "paraphrased"]},
        {"id": 7, "text": "t", "questions": "q3", "answers": "z"},
    ]  # fmt: skip
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    meta = load_question_meta(str(p))
    assert meta[("a", "q2")] == {"kind": "native", "style": "paraphrased", "depth": 0.9}
    assert meta[("7", "q3")] == {"kind": None, "style": None, "depth": None}
