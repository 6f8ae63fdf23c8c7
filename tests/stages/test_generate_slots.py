"""GenerateStage on the static engine (continuous batching) for every compression method.

Two decode slots and five requests, so rows finish, leave and their slots are
refilled from the batch. In fp32 the static engine must write the same rows as the
dynamic one (greedy, with and without prompt lookup), one row per request in order,
with error rows kept as rows; sampled rows depend on the request, not its batch.
"""

from __future__ import annotations

import pytest
from method_cases import method_batches, request, text_stages

from schemas.loading import spec_from_dict
from stages.compression import method_names
from stages.generate import GenerateStage
from stages.rows import batch_to_rows, rows_to_batch

RIVER = "The Elbe rises in the Giant Mountains and flows north to Hamburg and the sea. "
TEXTS = ["The river is the Elbe.", RIVER * 6, "Rivers: " + RIVER * 3 + "The Elbe, the Elbe.", RIVER, "Elbe " * 30]
GREEDY = {
    "plain": {"speculative": {"method": "none"}},
    "lookup": {"speculative": {"method": "prompt_lookup", "adaptive": False}},
}
# Every method with prompt lookup; plain greedy on two (the method matrix elsewhere covers the rest).
CASES = [(m, "lookup") for m in method_names()] + [("none", "plain"), ("finch", "plain")]
COMPARED = ("output_text", "output_tokens", "context_tokens", "prompt_tokens", "draft_tokens", "accepted_tokens")


def _spec(method_env, method: str, engine: str, **gen) -> dict:
    spec = method_env.spec(method, max_new_tokens=8, engine=engine, **gen)
    spec["resources"] = {**spec.get("resources", {}), "decode_slots": 2, "batch_size": 5}
    return spec_from_dict(spec).model_dump(mode="json")


@pytest.fixture(scope="module")
def batches(method_env) -> dict[str, dict]:
    return method_batches(method_env, TEXTS)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("method", "variant"), CASES)
def test_static_engine_writes_the_rows_of_the_dynamic_one(method_env, batches, method, variant):
    static = GenerateStage(_spec(method_env, method, "static", **GREEDY[variant]))
    dynamic = GenerateStage(_spec(method_env, method, "dynamic", **GREEDY[variant]))
    assert static.slot_engine is not None and dynamic.slot_engine is None
    rows = batch_to_rows(static(batches[method]))
    ref = batch_to_rows(dynamic(batches[method]))
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(len(TEXTS))]
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    for c in COMPARED:
        assert [r[c] for r in rows] == [r[c] for r in ref], c
    assert static.slot_engine.stats.refills > 1  # five requests streamed through two slots
    for r in rows:
        assert r["e2e_s"] >= r["ttft_s"] > 0 and r["decode_steps"] >= 0


@pytest.mark.usefixtures("one_thread")
def test_kv_autocompressor_on_the_static_engine_writes_the_dynamic_rows(method_env, batches):
    def stage(engine: str) -> GenerateStage:
        return GenerateStage(_spec(method_env, "autocompressor-kv", engine, **GREEDY["lookup"]))

    from stages.autocompressor.kv_form import kept_offsets
    from stages.autocompressor.prefill import document_segments

    static = stage("static")
    rows = batch_to_rows(static(batches["autocompressor"]))
    ref = batch_to_rows(stage("dynamic")(batches["autocompressor"]))
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    for c in COMPARED:
        assert [r[c] for r in rows] == [r[c] for r in ref], c
    # every 4th token of each segment kept (the chat prefix and question are not counted)
    cfg = static.spec.compression
    segments = [document_segments(list(r["doc_ids"]), cfg.segment_tokens, cfg.target_tokens)
                for r in batch_to_rows(batches["autocompressor"])]
    assert [r["context_tokens"] for r in rows] == [sum(len(kept_offsets(len(s), 4)) for s in segs) for segs in segments]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method", ["none", "finch"])
def test_sampling_on_the_static_engine_is_per_request(method_env, batches, method):
    """Sampled text depends on the request's seed, not on its batch (device_sampling.py)."""
    stage = GenerateStage(_spec(method_env, method, "static", temperature=0.9, seed=3))
    rows = batch_to_rows(stage(batches[method]))
    assert all(r["error"] is None and 1 <= r["output_tokens"] <= 8 for r in rows)
    alone = batch_to_rows(stage(rows_to_batch(batch_to_rows(batches[method])[3:4])))
    assert alone[0]["output_text"] == rows[3]["output_text"]
    greedy = batch_to_rows(GenerateStage(_spec(method_env, method, "static"))(batches[method]))
    assert [r["output_text"] for r in rows] != [r["output_text"] for r in greedy]


@pytest.mark.usefixtures("one_thread")
def test_error_rows_stay_rows(method_env):
    stage = GenerateStage(_spec(method_env, "none", "static"))
    reqs = [request(i, t) for i, t in enumerate(TEXTS[:3])]
    reqs.append(request(3, None, error="read: f3 is empty"))
    batch = batch_to_rows(text_stages(method_env.spec("none"))[0](rows_to_batch(reqs)))
    batch[1]["doc_ids"] = [10**9]  # out of vocabulary: this request's prefill raises
    rows = batch_to_rows(stage(rows_to_batch(batch)))
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2", "r3"]
    assert rows[0]["error"] is None and rows[2]["error"] is None
    assert rows[1]["error"].startswith("generate: ") and rows[1]["output_text"] is None
    assert rows[3]["error"] == "read: f3 is empty"


def test_engine_and_slots_are_checked_in_the_spec(method_env):
    spec = method_env.spec("none")
    with pytest.raises(ValueError, match="auto.*dynamic.*static|dynamic.*static"):
        spec_from_dict({**spec, "generation": {**spec["generation"], "engine": "fast"}})
    with pytest.raises(ValueError, match="decode_slots"):
        spec_from_dict({**spec, "resources": {**spec["resources"], "decode_slots": 0}})
    with pytest.raises(ValueError, match=r"resources.decode_slots.*more than batch_size 4.*allowed: <= batch_size"):
        spec_from_dict({**spec, "resources": {**spec["resources"], "batch_size": 4, "decode_slots": 8}})
