"""The shared method matrix: every registered compression method (stages/compression/)
through the same checks, tokenize -> [text stage] -> generate on a tiny model.

- one output row per request, in order; a row that failed upstream stays an error row;
- the budget holds: context_tokens <= target_tokens (exactly min(target, doc) for the
  methods with an exact budget), compression_ratio = doc_tokens / context_tokens;
- a document longer than the model's context window is compressed by every method
  that has a budget or reads any length, and is an error row naming the window for
  the others;
- the chain declared by the method (needs/adds) is what the stages really produce.
A new method module is picked up here with no edit; method_cases.VARIANTS adds a method
run in another form (the AutoCompressor's kv form).
"""

from __future__ import annotations

import pytest
from method_cases import TARGET, WINDOW, cases, method_of, request, text_stages

from schemas.rows import CompressedRow, TokenizedRow, columns
from stages.compression import registry
from stages.compression.base import CONTEXT_COLUMNS
from stages.generate import GenerateStage
from stages.rows import batch_to_rows, rows_to_batch

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCE = "The river Elbe rises in the Giant Mountains and flows north to the sea at Hamburg. "
SHORT = "The river is the Elbe."
MEDIUM = SENTENCE * 8  # ~150 tokens: over TARGET, inside the window
LONG = SENTENCE * 90  # ~1700 tokens: longer than the 1024-token window


def run(spec: dict, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows as generate receives them, output rows)."""
    batch = rows_to_batch(rows)
    for stage in text_stages(spec):
        batch = stage(batch)
    before = batch_to_rows(batch)
    return before, batch_to_rows(GenerateStage(spec)(batch))


@pytest.fixture(scope="module")
def results(method_env) -> dict[str, tuple[list[dict], list[dict]]]:
    """Per case (method or variant): one batch of [short, medium, failed upstream, long]."""
    reqs = [
        request(0, SHORT),
        request(1, MEDIUM),
        request(2, None, error="read: d2.txt is not valid UTF-8 (byte 3)"),
        request(3, LONG),
    ]
    return {m: run(method_env.spec(m), [dict(r) for r in reqs]) for m in cases()}


@pytest.mark.parametrize("case", cases())
def test_one_row_per_request_and_errors_stay_rows(case, results) -> None:
    _, out = results[case]
    assert [o["request_id"] for o in out] == ["r0", "r1", "r2", "r3"]
    assert out[0]["error"] is None and out[1]["error"] is None, (out[0]["error"], out[1]["error"])
    assert out[2]["error"] == "read: d2.txt is not valid UTF-8 (byte 3)"
    assert out[2]["error_kind"] == "input" and out[2]["output_text"] is None
    assert all(o["compression"] == method_of(case) for o in out)
    for o in (out[0], out[1]):
        assert o["output_text"] is not None and 1 <= o["output_tokens"] <= 5


@pytest.mark.parametrize("case", cases())
def test_budget_holds(case, results, method_env) -> None:
    method = method_of(case)
    config = registry()[method].spec_model.model_validate(method_env.spec(case)["compression"])
    target = getattr(config, "target_tokens", None)
    _, out = results[case]
    for o in out:
        if o["error"]:
            continue
        assert 0 < o["context_tokens"]
        assert o["compression_ratio"] == pytest.approx(o["doc_tokens"] / o["context_tokens"])
        if target is not None:
            assert o["context_tokens"] <= target
        if registry()[method].fills_budget:  # a quota, not a cap (the method says which)
            assert o["context_tokens"] == min(target, o["doc_tokens"])
        if method == "none":
            assert o["context_tokens"] == o["doc_tokens"]


@pytest.mark.parametrize("case", cases())
def test_documents_longer_than_the_window(case, results) -> None:
    m = registry()[method_of(case)]
    _, out = results[case]
    long = out[3]
    assert long["doc_tokens"] > WINDOW
    if m.reads_any_length or m.runs_at != "prefill":
        assert long["error"] is None, long["error"]
        assert long["context_tokens"] < WINDOW
    else:
        assert f"more than the model's context of {WINDOW}" in long["error"]
        assert long["error_kind"] == "input"


@pytest.mark.parametrize("case", cases())
def test_declared_columns_are_what_the_stages_produce(case, results) -> None:
    m = registry()[method_of(case)]
    before, _ = results[case]
    expected = set(columns(TokenizedRow)) | set(m.adds)
    if m.runs_at in ("tokenize", "text_stage"):
        assert set(columns(CompressedRow)) <= expected
    for row in before:
        assert set(row) == expected, set(row) ^ expected
        assert set(m.needs) <= set(row)
    if m.adds:
        ok = [r for r in before if not r["error"]]
        assert all(r[c] is not None for r in ok for c in CONTEXT_COLUMNS)
        assert all(len(r["context_ids"]) == r["context_tokens"] <= TARGET for r in ok)


@pytest.mark.parametrize("case", cases())
def test_retrieval_figures_reach_the_output(case, results) -> None:
    """rag and bm25 fill the retrieval columns (a document that fits: 0 chunks ranked, no
    score); every other method leaves them null. Only rag has an embedder to overflow."""
    method = method_of(case)
    _, out = results[case]
    figures = ("retrieval_chunks", "retrieved_chunks", "retrieval_top_score", "retrieval_mean_score")
    for o in out:
        if method not in ("rag", "bm25") or o["error"]:
            assert all(o[c] is None for c in (*figures, "embedder_truncated_chunks")), o
            continue
        ranked = o["context_tokens"] < o["doc_tokens"]
        assert (o["retrieval_chunks"] > 0) == ranked
        assert 0 < o["retrieved_chunks"] <= o["retrieval_chunks"] if ranked else o["retrieved_chunks"] == 0
        assert (o["retrieval_top_score"] is not None) == ranked
        if ranked:
            assert o["retrieval_top_score"] >= o["retrieval_mean_score"]
        assert o["embedder_truncated_chunks"] == (0 if method == "rag" else None)



ANY_LENGTH_UNBUDGETED = [
    c for c in cases()
    if registry()[method_of(c)].reads_any_length
    and "target_tokens" in (fields := registry()[method_of(c)].spec_model.model_fields)
    and fields["target_tokens"].default is None
]  # fmt: skip


@pytest.mark.parametrize("case", ANY_LENGTH_UNBUDGETED)
def test_a_method_that_reads_any_length_reads_a_long_document_whole(case, method_env, results) -> None:
    """With no target_tokens, the whole document (over the model's window) is compressed
    into what fits the window (the AutoCompressor: every segment), so it keeps more than
    the same method given only the document's last TARGET tokens (the matrix's run)."""
    spec = method_env.spec(case)
    spec["compression"]["target_tokens"] = None
    _, out = run(spec, [request(3, LONG)])
    whole, tail = out[0], results[case][1][3]
    assert whole["error"] is None, whole["error"]
    assert whole["doc_tokens"] == tail["doc_tokens"] > WINDOW > whole["context_tokens"]
    assert whole["context_tokens"] > tail["context_tokens"]
