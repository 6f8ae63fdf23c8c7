"""The output schema: column contract and figure definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas import output

ISSUE_COLUMNS = (
    "run_id run_date job doc_id request_id source_uri task prompt output_text model compression "
    "speculative doc_tokens context_tokens compression_ratio prompt_tokens output_tokens "
    "draft_tokens accepted_tokens acceptance_rate decode_steps compress_s prefill_s ttft_s "
    "decode_s e2e_s device device_s cost_usd error"
).split()


def test_every_contract_column_is_present_and_documented():
    for col in ISSUE_COLUMNS:
        assert col in output.OUTPUT_COLUMNS
        assert output.COLUMN_DOCS[col]
    assert output.OUTPUT_SCHEMA.metadata[b"longdoc.schema_version"] == str(output.SCHEMA_VERSION).encode()


def test_rows_to_table_fills_missing_and_drops_unknown():
    ident = {"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d", "request_id": "q"}
    t = output.rows_to_table([{**ident, "doc_tokens": 10, "bogus": 1}, {**ident, "error": "x"}])
    assert t.schema.equals(output.OUTPUT_SCHEMA, check_metadata=False)
    assert t.column("doc_tokens").to_pylist() == [10, None]
    assert t.column("doc_tokens").type == pa.int64()


def test_figure_definitions():
    assert output.compression_ratio(1000, 250) == 4.0
    assert output.compression_ratio(10, 0) is None
    assert output.acceptance_rate(3, 4) == 0.75
    assert output.acceptance_rate(0, 0) is None
    assert output.cost_usd(3600, 2.5) == 2.5
    assert output.cost_usd(1800, 2.5, text_compress_s=1800) == 2.5  # a text method's compress_s is charged
    assert output.mean_accepted_per_step(10, 4) == 2.0


SNAPSHOT = Path(__file__).with_name("output_schema_snapshot.json")


def test_schema_only_grows_against_the_committed_snapshot():
    """Additive-only rule: every version's columns are a prefix of the next one's, and
    the current schema is exactly the snapshot's latest version (bump + record it)."""
    versions = json.loads(SNAPSHOT.read_text())["versions"]
    ordered = [versions[k] for k in sorted(versions, key=int)]
    for older, newer in zip(ordered, ordered[1:]):
        assert newer[: len(older)] == older, "a column was removed, renamed, retyped or moved"
        assert len(newer) > len(older)
    current = [[f.name, str(f.type)] for f in output.OUTPUT_SCHEMA]
    assert max(versions, key=int) == str(output.SCHEMA_VERSION)
    assert current == ordered[-1], "OUTPUT_SCHEMA differs from the snapshot of its version"


def test_partition_column_is_in_the_folder_only_and_identity_is_non_null():
    assert "run_date" in output.OUTPUT_SCHEMA.names and "run_date" not in output.FILE_SCHEMA.names
    assert output.FILE_SCHEMA.names == [c for c in output.OUTPUT_COLUMNS if c != "run_date"]
    for f in output.OUTPUT_SCHEMA:
        assert f.nullable == (f.name not in output.IDENTITY_COLUMNS), f.name
        assert f.metadata[b"description"].decode() == output.COLUMN_DOCS[f.name]
    assert {"run_id", "job", "doc_id", "request_id"} <= set(output.IDENTITY_COLUMNS)


def test_descriptions_and_required_columns_survive_a_parquet_round_trip(tmp_path):
    rows = [{"run_id": "r", "job": "j", "doc_id": "d", "request_id": "q", "error": "read: empty",
             "error_kind": output.INPUT}]
    pq.write_table(output.rows_to_table(rows, output.FILE_SCHEMA), tmp_path / "f.parquet")
    schema = pq.read_schema(tmp_path / "f.parquet")
    assert schema.field("cost_usd").metadata[b"description"].decode() == output.COLUMN_DOCS["cost_usd"]
    assert not schema.field("request_id").nullable
    parquet_schema = pq.ParquetFile(tmp_path / "f.parquet").schema
    assert parquet_schema.column(parquet_schema.names.index("doc_id")).max_definition_level == 0  # REQUIRED
    assert pq.read_table(tmp_path / "f.parquet").column("schema_version").to_pylist() == [output.SCHEMA_VERSION]


def test_identity_columns_are_required_on_error_rows_too():
    with pytest.raises(ValueError, match="has no doc_id"):
        output.rows_to_table([{"run_id": "r", "run_date": "2026-01-01", "job": "j", "request_id": "q",
                               "error": "read: x"}])


def test_error_kind_classification():
    assert output.classify_error(MemoryError()) == output.RETRYABLE
    assert output.classify_error(FileNotFoundError("s3://b/k")) == output.RETRYABLE  # storage
    assert output.classify_error(TimeoutError()) == output.RETRYABLE
    import ray.exceptions
    import torch

    assert output.classify_error(torch.cuda.OutOfMemoryError("CUDA out of memory")) == output.RETRYABLE
    assert output.classify_error(ray.exceptions.ActorDiedError()) == output.RETRYABLE
    assert output.classify_error(ray.exceptions.WorkerCrashedError()) == output.RETRYABLE
    assert output.classify_error(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")) == output.INPUT
    assert output.classify_error(json.JSONDecodeError("x", "", 0)) == output.INPUT
    assert output.classify_error(RuntimeError("unknown")) == output.RETRYABLE
    # A failed row without a kind gets the default; a successful row has none.
    t = output.rows_to_table([{"run_id": "r", "run_date": "d", "job": "j", "doc_id": "d", "request_id": "1",
                               "error": "generate: boom"},
                              {"run_id": "r", "run_date": "d", "job": "j", "doc_id": "d", "request_id": "2"}])
    assert t.column("error_kind").to_pylist() == [output.RETRYABLE, None]


@pytest.mark.parametrize(
    ("kind", "policy", "retried"),
    [("input", "all", True), ("input", "retryable", False), ("retryable", "retryable", True),
     (None, "retryable", True), ("retryable", "none", False)],
)
def test_retry_policy(kind, policy, retried):
    assert output.is_retried(kind, policy) is retried


def test_retry_policy_rejects_unknown_values():
    with pytest.raises(ValueError, match="all, retryable, none"):
        output.is_retried("input", "some")


# ----------------------------------------------------------------- the one definition
def _spec():
    from schemas.loading import spec_from_dict

    return spec_from_dict({"name": "j", "input": {"uri": "/in"}, "task": {"kind": "qa", "questions": ["Q?"]},
                           "compression": {"method": "truncate", "target_tokens": 64},
                           "generation": {"speculative": {"method": "none"}}})


REQUEST = {"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d", "request_id": "q",
           "source_uri": "file:///in/d.txt", "task": "qa", "prompt": "Q?", "reference": "A",
           "doc_tokens": 120, "doc_ids": [1, 2, 3], "text": "not an output column"}


def test_everything_is_derived_from_the_output_row_definition():
    """Schema, docs, identity columns and the builder's column groups all come from OutputRow."""
    import typing

    hints = typing.get_type_hints(output.OutputRow, include_extras=True)
    assert list(hints) == output.OUTPUT_COLUMNS == output.OUTPUT_SCHEMA.names
    assert output.IDENTITY_COLUMNS == ("run_id", "run_date", "job", "doc_id", "request_id", "schema_version")
    assert output.OUTPUT_SCHEMA.field("schema_version").type == pa.int32()
    assert output.OUTPUT_SCHEMA.field("doc_tokens").type == pa.int64()
    assert output.OUTPUT_SCHEMA.field("acceptance_rate").type == pa.float64()
    groups = (set(output.REQUEST_COLUMNS), set(output.SPEC_COLUMNS), set(output.FIGURE_COLUMNS),
              {"error", "error_kind", "schema_version"})
    assert set().union(*groups) == set(output.OUTPUT_COLUMNS)
    assert sum(map(len, groups)) == len(output.OUTPUT_COLUMNS)  # each column filled by one source
    assert set(output.IDENTITY_COLUMNS) - {"schema_version"} <= set(output.REQUEST_COLUMNS)


def test_output_row_builds_success_rows_from_request_spec_and_figures():
    row = output.output_row(_spec(), REQUEST, output_text="A.", output_tokens=3, context_tokens=64,
                            retrieval_chunks=None)
    assert list(row) == output.OUTPUT_COLUMNS
    assert {k: row[k] for k in output.REQUEST_COLUMNS} == {k: REQUEST[k] for k in output.REQUEST_COLUMNS}
    assert (row["model"], row["compression"], row["speculative"]) == ("embedded:smollm2-135m-instruct",
                                                                       "truncate", "none")
    assert (row["output_text"], row["output_tokens"], row["context_tokens"]) == ("A.", 3, 64)
    assert row["target_tokens"] == 64  # the budget beside the method: runs in one folder group apart
    from schemas.compression import compression_models

    none = _spec().model_copy(update={"compression": compression_models()["none"]()})
    assert output.output_row(none, REQUEST)["target_tokens"] is None
    assert row["error"] is None and row["error_kind"] is None and row["decode_s"] is None
    assert row["schema_version"] == output.SCHEMA_VERSION
    table = output.rows_to_table([row], output.FILE_SCHEMA)
    assert table.column("doc_tokens").to_pylist() == [120]


def test_output_row_builds_error_rows_and_keeps_an_upstream_kind():
    spec = _spec()
    row = output.output_row(spec, REQUEST, error="generate: boom", error_kind=output.RETRYABLE)
    assert (row["error"], row["error_kind"], row["output_text"]) == ("generate: boom", output.RETRYABLE, None)
    assert row["request_id"] == "q" and row["model"] == spec.generation.model
    upstream = {**REQUEST, "error": "read: bad utf-8", "error_kind": output.INPUT}
    assert output.output_row(spec, upstream, error=upstream["error"])["error_kind"] == output.INPUT
    # A request that carries a kind but did not fail does not pass it on.
    assert output.output_row(spec, {**REQUEST, "error_kind": output.INPUT})["error_kind"] is None
    # Only what the read stage knows: identity and the question; the rest stays null.
    read_only = {k: REQUEST[k] for k in ("run_id", "run_date", "job", "doc_id", "request_id", "prompt")}
    row = output.output_row(spec, read_only, error="run: aborted", error_kind=output.RETRYABLE)
    assert row["doc_tokens"] is None and row["source_uri"] is None and row["prompt"] == "Q?"


def test_output_row_rejects_a_column_it_does_not_fill():
    with pytest.raises(ValueError, match=r"output_txt not a figure column of the output row; allowed: output_text"):
        output.output_row(_spec(), REQUEST, output_txt="typo")
    with pytest.raises(ValueError, match="request_id not a figure column"):
        output.output_row(_spec(), REQUEST, request_id="copied from the request, never passed")
    # figures set after the row is built are checked the same way, and set
    row = output.output_row(_spec(), REQUEST)
    with pytest.raises(ValueError, match="devcie not a figure column"):
        output.set_figures(row, devcie="cpu")
    assert output.set_figures(row, device="cpu", cost_usd=0.5) is row and row["device"] == "cpu"


def test_an_errors_cause_is_the_exception_raised_last_and_the_stage_whose_actor_failed():
    """A Ray actor's creation failure quotes its whole traceback: an abort printed 2,000
    characters of it and stopped before the cause."""

    class ActorDiedError(Exception):
        pass

    wrapped = ActorDiedError(
        "The actor died because of an error raised in its creation task, "
        "ray::MapWorker(MapBatches(GenerateStage)).__init__() (pid=1, ip=10.0.0.1)\n"
        "Traceback (most recent call last):\n  File \"stages/generate.py\", line 86, in __init__\n"
        "    self.service = EngineService(self._load_and_build)\n"
        "ValueError: Couldn't instantiate the backend tokenizer from one of:\n(1) a serialization file,\n"
        "(2) a slow tokenizer.\n")
    assert output.error_cause(wrapped) == (
        "the generate stage's actor could not start: ValueError: Couldn't instantiate the backend tokenizer "
        "from one of: (1) a serialization file, (2) a slow tokenizer.")
    assert output.error_cause(MemoryError("cannot allocate")) == "MemoryError: cannot allocate"
    # A plain exception's message on several lines: all of it, not its last line.
    assert output.error_cause(ValueError("Couldn't instantiate the tokenizer from one of:\n(1) a file,\n(2) a class.")) == (
        "ValueError: Couldn't instantiate the tokenizer from one of: (1) a file, (2) a class.")
    # A bare exception name counts as one (review: 'Exception: boom' was missed).
    assert output.error_cause(RuntimeError("wrapped:\nTraceback (most recent call last):\nException: boom\nmore")) == (
        "Exception: boom more")
    assert output.error_cause(RuntimeError("")) == "RuntimeError: no message"
    assert len(output.error_cause(RuntimeError("x" * 900))) == 500
