"""The output table: one Parquet row per request. Column names are a contract.

Every figure is defined exactly once, here, in ``COLUMN_DOCS``; code that computes a
figure cites this module. The schema is explicit (never inferred from data) so that
files from different runs and workers always union cleanly in DuckDB/Spark/pandas.
``SCHEMA_VERSION`` is stored in every file's metadata and bumps on any change.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

SCHEMA_VERSION = "1"

# name -> (arrow type, definition). Order is the column order in files.
_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("run_id", pa.string(), "Identifier of the run that wrote the row."),
    ("run_date", pa.string(), "Logical date of the run (YYYY-MM-DD); also the hive partition."),
    ("job", pa.string(), "JobSpec.name."),
    ("doc_id", pa.string(), "Document id (file path relative to the input root, or id_field)."),
    ("request_id", pa.string(), "Stable hash of (doc_id, prompt, document text, generation settings, compression)."),
    ("source_uri", pa.string(), "URI of the file the document was read from."),
    ("task", pa.string(), "summarize | qa."),
    ("prompt", pa.string(), "The question (qa) or the summary instruction (summarize)."),
    ("reference", pa.string(), "Reference answer from input.answer_field, if any (evaluation only)."),
    ("output_text", pa.string(), "Generated text (stop strings and EOS removed). Null on error."),
    ("model", pa.string(), "Generating model as named in the spec."),
    ("compression", pa.string(), "Compression method: none | truncate | rag | finch | autocompressor."),
    ("speculative", pa.string(), "Decoding method: none | prompt_lookup."),
    ("doc_tokens", pa.int64(), "Document length in the generating model's tokens."),
    ("context_tokens", pa.int64(), "Document tokens (or KV entries / summary vectors) the model conditioned on after compression."),
    ("compression_ratio", pa.float64(), "doc_tokens / context_tokens (1.0 for none)."),
    ("prompt_tokens", pa.int64(), "Tokens prefilled for generation: chat template + context + question."),
    ("output_tokens", pa.int64(), "Generated tokens, including the EOS token if one was produced."),
    ("draft_tokens", pa.int64(), "Draft tokens proposed by speculation and sent for verification."),
    ("accepted_tokens", pa.int64(), "Draft tokens accepted by verification (bonus tokens not counted)."),
    ("acceptance_rate", pa.float64(), "accepted_tokens / draft_tokens; null when nothing was drafted."),
    ("decode_steps", pa.int64(), "Target-model forward passes after prefill that this row took part in."),
    ("mean_accepted_per_step", pa.float64(), "output_tokens / (decode_steps + 1): tokens emitted per forward pass, prefill's first token included."),
    ("compress_s", pa.float64(), "Seconds spent compressing the context (text stage, or Finch/AutoCompressor prefill minus the final prompt pass)."),
    ("prefill_s", pa.float64(), "Seconds of the prefill that produced the first token, for the batch this row was in."),
    ("ttft_s", pa.float64(), "Seconds from the start of this row's batch to its first generated token."),
    ("decode_s", pa.float64(), "Seconds from the first generated token to this row's last one."),
    ("e2e_s", pa.float64(), "compress_s + seconds from the start of its batch to this row's completion."),
    ("device", pa.string(), "cpu | cuda:<name> of the generate actor."),
    ("device_s", pa.float64(), "This row's share of its actor's busy time: batch wall time / rows in the batch."),
    ("cost_usd", pa.float64(), "device_s * cost.usd_per_device_hour / 3600."),
    ("error", pa.string(), "Null on success; otherwise a readable message naming the stage and the problem."),
]

OUTPUT_SCHEMA: pa.Schema = pa.schema(
    [pa.field(name, typ) for name, typ, _ in _COLUMNS],
    metadata={"longdoc.schema_version": SCHEMA_VERSION},
)
COLUMN_DOCS: dict[str, str] = {name: doc for name, _, doc in _COLUMNS}
OUTPUT_COLUMNS: list[str] = [name for name, _, _ in _COLUMNS]


def compression_ratio(doc_tokens: int, context_tokens: int) -> float | None:
    """doc_tokens / context_tokens, or None when there is no context."""
    return doc_tokens / context_tokens if context_tokens > 0 else None


def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """accepted / drafted, or None when nothing was drafted."""
    return accepted / drafted if drafted > 0 else None


def mean_accepted_per_step(output_tokens: int, decode_steps: int) -> float | None:
    return output_tokens / (decode_steps + 1) if output_tokens > 0 else None


def cost_usd(device_s: float, usd_per_device_hour: float) -> float:
    return device_s * usd_per_device_hour / 3600.0


def empty_row() -> dict[str, Any]:
    """A row with every column present and null, to be filled by the stages."""
    return dict.fromkeys(OUTPUT_COLUMNS)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Build a table with exactly OUTPUT_SCHEMA; unknown keys are dropped, missing are null."""
    cols = {name: [r.get(name) for r in rows] for name in OUTPUT_COLUMNS}
    return pa.Table.from_pydict(cols, schema=OUTPUT_SCHEMA)
