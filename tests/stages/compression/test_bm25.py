"""Method bm25: BM25 scores, exact budget in document order, retrieval of the chunk that
holds the question's words, and the stage's row contract. (The shared matrix in
test_methods.py and tests/stages/test_generate.py run it end to end.)"""

from __future__ import annotations

import math

import pytest

from schemas.loading import spec_from_dict
from stages.compression.bm25 import (
    Bm25Compression,
    Bm25Stage,
    bm25_result,
    bm25_scores,
)
from stages.rows import batch_to_rows, rows_to_batch

FILLER = "The committee met on Tuesday and discussed the budget for the coming year at length. "
NEEDLE = "The lighthouse keeper of Skerryvore paints the lamp room blue every spring. "


def test_scores_follow_bm25() -> None:
    chunks = [[1, 2, 3, 3], [1, 4, 5, 6], [1, 7, 8, 9]]
    s = bm25_scores(chunks, [1, 3], k1=1.5, b=0.0)
    assert s[1] == s[2] > 0  # token 1 is in every chunk: a small weight for all
    idf3 = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    assert s[0] == pytest.approx(s[1] + idf3 * 2 * 2.5 / (2 + 1.5))  # tf 2 of token 3
    assert bm25_scores(chunks, [99], 1.5, 0.75) == [0.0, 0.0, 0.0]
    # A query token counts once, however often the question repeats it (bm25s adds it again).
    assert bm25_scores(chunks, [3, 1, 3], k1=1.5, b=0.0) == s
    # An empty query (a question of no tokens) scores nothing, and does not fail the row.
    assert bm25_scores(chunks, [], 1.5, 0.75) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("target", [1, 5, 17, 40, 100])
def test_exact_budget_in_document_order(target: int) -> None:
    doc = list(range(10, 70))
    out = bm25_result(doc, [15, 42, 43], Bm25Compression(target_tokens=target, chunk_tokens=8)).context_ids
    assert len(out) == min(target, len(doc)) and out == sorted(out)
    if target >= 16:
        assert {15, 42, 43} <= set(out)


def test_stage_keeps_the_chunk_with_the_answer_and_every_row(tokenizer, tiny_model_dir) -> None:
    spec = spec_from_dict(
        {"name": "b", "input": {"uri": "/in"}, "task": {"kind": "qa", "questions": ["q"]},
         "generation": {"model": str(tiny_model_dir)},
         "compression": {"method": "bm25", "target_tokens": 48, "chunk_tokens": 16}}
    ).model_dump(mode="json")  # fmt: skip
    doc = tokenizer(FILLER * 4 + NEEDLE + FILLER * 4, add_special_tokens=False)["input_ids"]
    rows = [
        {"doc_ids": doc, "question": "What colour is the lamp room of Skerryvore?", "instruction": "Answer.", "error": None},
        {"doc_ids": None, "question": None, "instruction": "Summarize.", "error": "read: gone"},
        {"doc_ids": None, "question": "Why?", "instruction": "Answer.", "error": None},
    ]  # fmt: skip
    out = batch_to_rows(Bm25Stage(spec)(rows_to_batch(rows)))
    assert len(out) == 3 and out[0]["error"] is None
    assert out[0]["context_tokens"] == len(out[0]["context_ids"]) == 48
    assert "Skerryvore paints the lamp room blue" in tokenizer.decode(out[0]["context_ids"])
    # Retrieval figures: 16-token chunks ranked, 3 kept, BM25 scores; no embedder to overflow.
    assert out[0]["retrieval_chunks"] == math.ceil(len(doc) / 16) and out[0]["retrieved_chunks"] == 3
    assert out[0]["retrieval_top_score"] >= out[0]["retrieval_mean_score"] > 0
    assert "embedder_truncated_chunks" not in out[0]
    assert out[1]["retrieval_chunks"] is None and out[2]["retrieval_top_score"] is None
    assert out[1]["error"] == "read: gone" and out[1]["context_ids"] is None
    assert out[2]["error"].startswith("bm25: ValueError") and out[2]["context_ids"] is None


def test_result_figures_for_a_document_that_fits_and_one_that_does_not() -> None:
    config = Bm25Compression(target_tokens=20, chunk_tokens=8)
    fits = bm25_result(list(range(20)), [3], config)
    assert fits.context_ids == list(range(20)) and fits.figures()["retrieval_chunks"] == 0
    assert fits.figures()["retrieval_top_score"] is None
    ranked = bm25_result(list(range(40)), [3, 35], config).figures()
    assert ranked["retrieval_chunks"] == 5 and ranked["retrieved_chunks"] == 3
    assert ranked["retrieval_top_score"] > 0
