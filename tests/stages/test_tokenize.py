"""The tokenize stage (stages/tokenize.py): RequestRow -> TokenizedRow, a method that
runs at tokenize rides along, failed rows pass through, over-long documents fail as input."""

from __future__ import annotations

import pytest

from schemas.loading import spec_from_dict
from schemas.output import INPUT
from schemas.rows import CompressedRow, TokenizedRow, columns
from stages.rows import batch_to_rows, rows_to_batch
from stages.tokenize import TokenizeStage

TEXT = "The Danube flows through ten countries. Its delta lies in Romania and Ukraine."


def _spec(tiny_model_dir, **overrides) -> dict:
    doc = {"name": "t", "input": {"uri": "/in", **overrides.pop("input", {})}, "task": {"kind": "summarize"},
           "generation": {"model": str(tiny_model_dir)}, **overrides}
    return spec_from_dict(doc).model_dump(mode="json")


def _request(i: int, text: str | None, error: str | None = None) -> dict:
    return {"request_id": f"r{i}", "run_id": "run", "run_date": "2026-01-01", "job": "t", "doc_id": f"d{i}",
            "source_uri": f"f{i}", "task": "summarize", "prompt": "Summarize.", "instruction": "Summarize.",
            "question": None, "reference": None, "text": text, "error": error,
            "error_kind": INPUT if error else None, "doc_requests": 1}


@pytest.fixture(scope="module")
def stage(tiny_model_dir) -> TokenizeStage:
    return TokenizeStage(_spec(tiny_model_dir))


def test_rows_get_the_generating_tokenizers_ids(stage, tokenizer):
    (row,) = batch_to_rows(stage(rows_to_batch([_request(0, TEXT)])))
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert row["doc_ids"] == ids and row["doc_tokens"] == len(ids)
    assert set(columns(TokenizedRow)) <= set(row) and row["error"] is None
    assert "context_ids" not in row  # method none: no compression rides along


def test_a_failed_row_passes_through_untouched(stage):
    failed = _request(1, None, error="read: not UTF-8")
    (row,) = batch_to_rows(stage(rows_to_batch([failed])))
    assert (row["error"], row["error_kind"], row["doc_ids"], row["doc_tokens"]) == ("read: not UTF-8", INPUT, None, None)


def test_a_document_over_max_doc_tokens_is_a_final_input_error(tiny_model_dir, tokenizer):
    n = len(tokenizer(TEXT, add_special_tokens=False)["input_ids"])
    stage = TokenizeStage(_spec(tiny_model_dir, input={"max_doc_tokens": n - 1}))
    ok, long = batch_to_rows(stage(rows_to_batch([_request(0, "Short."), _request(1, TEXT)])))
    assert ok["error"] is None
    assert long["error"].startswith("tokenize: document 'd1' is") and f"max_doc_tokens={n - 1}" in long["error"]
    assert (long["error_kind"], long["doc_tokens"], long["doc_ids"]) == (INPUT, n, None)


def test_a_row_that_cannot_be_tokenized_fails_alone(stage):
    ok, bad = batch_to_rows(stage(rows_to_batch([_request(0, TEXT), _request(1, None)])))
    assert ok["error"] is None and ok["doc_tokens"]
    assert bad["error"].startswith("tokenize: ") and bad["error_kind"] == "retryable"


def test_a_method_that_runs_at_tokenize_adds_its_context(tiny_model_dir, tokenizer):
    spec = _spec(tiny_model_dir, compression={"method": "truncate", "target_tokens": 6, "keep": "head"})
    (row,) = batch_to_rows(TokenizeStage(spec)(rows_to_batch([_request(0, TEXT)])))
    assert set(columns(CompressedRow)) <= set(row)
    assert row["context_ids"] == row["doc_ids"][:6] and row["context_tokens"] == 6
    assert row["compress_s"] >= 0.0


def test_a_document_over_the_context_fails_here_under_method_none(stage, tiny_model_dir):
    """Under none a document longer than the context failed only in the generate stage,
    after the rows before it ran (a night of long reports: 2.5 minutes of 'failed 0')."""
    from stages.context_budget import model_context

    context = model_context(str(tiny_model_dir))
    long = "The river floods every spring. " * context  # more tokens than the context holds
    ok, over = batch_to_rows(stage(rows_to_batch([_request(0, TEXT), _request(1, long)])))
    assert ok["error"] is None
    assert over["error"].startswith("tokenize: document 'd1' needs ") and over["error_kind"] == INPUT
    assert f"more than the model's context of {context}; use compression.method truncate" in over["error"]
    # A method with a budget keeps its rows: the budget is what the model reads.
    truncate = TokenizeStage(_spec(tiny_model_dir, compression={"method": "truncate", "target_tokens": 16}))
    (row,) = batch_to_rows(truncate(rows_to_batch([_request(1, long)])))
    assert row["error"] is None and row["context_tokens"] == 16
