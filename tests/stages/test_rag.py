"""RagStage: the numpy-batch contract (error rows pass through, a bad row fails
alone, nothing dropped) and a run inside real Ray Data with an actor pool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from schemas.spec import JobSpec
from stages.rag import RagStage
from stages.rows import batch_to_rows, rows_to_batch

TEXT = (
    "The lighthouse keeper lit the lamp every evening at seven. Ships passing the rocky cape "
    "used its beam to steer clear of the reef. "
    "The harbour master recorded that the ferry Aurora carries exactly 312 passengers. "
    "In the village the bakery sold rye bread and the school had a small library. "
) * 3


def job_spec(target: int = 48, chunk: int = 16) -> dict[str, Any]:
    spec = JobSpec.model_validate(
        {
            "name": "rag-test",
            "input": {"uri": "memory://unused", "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa"},
            "compression": {"method": "rag", "target_tokens": target, "chunk_tokens": chunk},
        }
    )
    return spec.model_dump(mode="json")


def make_rows(tokenizer, n: int) -> list[dict[str, Any]]:
    doc = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    rows = []
    for i in range(n):
        rows.append(
            {
                "request_id": f"r{i}",
                "doc_ids": doc[: 40 + 30 * i],
                "question": "How many passengers does the ferry Aurora carry?",
                "instruction": "Answer briefly.",
                "error": None,
            }
        )
    return rows


@pytest.fixture(scope="module")
def stage() -> RagStage:
    return RagStage(job_spec())


def test_stage_adds_columns_and_keeps_every_row(stage: RagStage, tokenizer) -> None:
    rows = make_rows(tokenizer, 4)
    rows[1]["error"] = "read: file vanished"
    rows[1]["doc_ids"] = None
    rows[2]["doc_ids"] = None  # fails here, alone
    rows[3]["question"] = None  # summarize-style row: ranked against the instruction
    rows[3]["error"] = float("nan")  # how Ray may hand a null across mixed blocks
    out = batch_to_rows(stage(rows_to_batch(rows)))
    assert [r["request_id"] for r in out] == ["r0", "r1", "r2", "r3"]
    assert out[0]["context_ids"] == rows[0]["doc_ids"]  # 40 tokens fit the 48 budget
    assert out[0]["context_tokens"] == 40 and out[0]["error"] is None
    assert out[1]["error"] == "read: file vanished" and out[1]["context_ids"] is None
    assert out[2]["error"].startswith("rag: ValueError") and out[2]["context_ids"] is None
    assert out[3]["error"] is None and out[3]["context_tokens"] == 48
    assert len(out[3]["context_ids"]) == 48
    assert all(isinstance(r["compress_s"], float) for r in (out[0], out[3]))


def test_stage_retrieves_the_answer(stage: RagStage, tokenizer) -> None:
    rows = make_rows(tokenizer, 4)
    out = batch_to_rows(stage(rows_to_batch(rows)))
    assert "312" in tokenizer.decode(out[3]["context_ids"])


def test_stage_rejects_other_methods() -> None:
    spec = job_spec()
    spec["compression"] = {"method": "none"}
    with pytest.raises(ValueError, match="rag"):
        RagStage(spec)


def test_stage_in_ray_data(ray_session, tokenizer) -> None:
    from ray.data import ActorPoolStrategy

    rows = make_rows(tokenizer, 5)
    rows[2]["error"] = "tokenize: too long"
    # One block per row: batches then span blocks whose error column is null in
    # some and string in others (Ray hands such nulls over as NaN).
    ds = ray_session.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        RagStage,
        fn_constructor_kwargs={"spec": job_spec()},
        compute=ActorPoolStrategy(size=1),
        num_gpus=0,
        batch_size=2,
        batch_format="numpy",
    )
    out = sorted(ds.take_all(), key=lambda r: r["request_id"])
    assert len(out) == len(rows)
    for src, got in zip(rows, out, strict=True):
        if src["error"]:
            assert got["error"] == src["error"]
            continue
        assert got["error"] is None
        assert got["context_tokens"] == min(48, len(src["doc_ids"]))
        assert len(np.asarray(got["context_ids"])) == got["context_tokens"]
