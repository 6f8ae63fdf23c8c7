"""The output schema: column contract and figure definitions."""

from __future__ import annotations

import pyarrow as pa

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
    assert output.OUTPUT_SCHEMA.metadata[b"longdoc.schema_version"] == output.SCHEMA_VERSION.encode()


def test_rows_to_table_fills_missing_and_drops_unknown():
    t = output.rows_to_table([{"run_id": "r", "doc_tokens": 10, "bogus": 1}, {"error": "x"}])
    assert t.schema.equals(output.OUTPUT_SCHEMA, check_metadata=False)
    assert t.column("doc_tokens").to_pylist() == [10, None]
    assert t.column("doc_tokens").type == pa.int64()


def test_figure_definitions():
    assert output.compression_ratio(1000, 250) == 4.0
    assert output.compression_ratio(10, 0) is None
    assert output.acceptance_rate(3, 4) == 0.75
    assert output.acceptance_rate(0, 0) is None
    assert output.cost_usd(3600, 2.5) == 2.5
    assert output.mean_accepted_per_step(10, 4) == 2.0
