"""The output table: one Parquet row per request. Column names are a contract.

Every figure is defined exactly once, here, in ``COLUMN_DOCS``; code that computes a
figure cites this module. The schema is explicit (never inferred from data) so that
files from different runs and workers always union cleanly.

Layout (what every reader opens without options): ``{output}/run_date=YYYY-MM-DD/*.parquet``.
``run_date`` is a hive partition column: it lives in the folder name ONLY, never inside
the files (``FILE_SCHEMA`` = ``OUTPUT_SCHEMA`` minus ``PARTITION_COLUMNS``). A column in
both places breaks pandas/pyarrow.dataset ("Unable to merge: string vs dictionary") and
Spark ("Found duplicate column(s) in the data schema and the partition schema").
pandas, pyarrow, DuckDB (hive auto-detect), Polars (``hive_partitioning=True``) and
Spark's partition discovery all turn the folder back into the column.

Schema rules:
- ``SCHEMA_VERSION`` is stored in every row (``schema_version``) and in the file
  metadata, and bumps on any change.
- Additive only: columns are only ever appended. ``tests/schemas/output_schema_snapshot.json``
  records the columns of every version; a test fails when a column is removed,
  renamed, retyped or reordered.
- Each Arrow field carries its ``COLUMN_DOCS`` text as field metadata ``description``
  (kept in the file's Arrow schema; ``pq.read_schema(f).field(c).metadata``).
- Identity columns are non-null (``nullable=False``, Parquet REQUIRED), error rows too.

Errors: ``error`` says what failed; ``error_kind`` says whether a rerun can heal it
(``classify_error``): ``input`` (final: the request itself is bad) or ``retryable``
(infrastructure: actor lost, out of memory, storage, timeout, unexpected exception).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 3

INPUT = "input"  # final: the same input fails the same way on every rerun
RETRYABLE = "retryable"  # infrastructure: a rerun may succeed
ERROR_KINDS = (INPUT, RETRYABLE)

# name -> (arrow type, definition). Order is the column order in files.
_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("run_id", pa.string(), "Identifier of the run that wrote the row."),
    ("run_date", pa.string(), "Logical date of the run (YYYY-MM-DD). Hive partition: in the folder name run_date=..., not in the files."),
    ("job", pa.string(), "JobSpec.name."),
    ("doc_id", pa.string(), "Document id (file path relative to the input root, or id_field)."),
    ("request_id", pa.string(), "Stable hash of (doc_id, prompt, document text, generation settings, compression)."),
    ("source_uri", pa.string(), "URI of the file the document was read from."),
    ("task", pa.string(), "summarize | qa."),
    ("prompt", pa.string(), "The question (qa) or the summary instruction (summarize)."),
    ("reference", pa.string(), "Reference answer from input.answer_field, if any (evaluation only)."),
    ("output_text", pa.string(), "Generated text (stop strings and EOS removed). Null on error."),
    ("model", pa.string(), "Generating model as named in the spec."),
    ("compression", pa.string(), "Compression method: a registered method name (`longdoc methods` lists them: none, truncate, rag, bm25, finch, autocompressor, ...)."),
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
    # --- version 2 (columns are only appended; see the module docstring) ---
    ("error_kind", pa.string(), "Null on success; input (final: the request itself is bad) or retryable (infrastructure: a rerun of the date retries it)."),
    ("schema_version", pa.int32(), "Version of this schema the row was written with (schemas.output.SCHEMA_VERSION)."),
    # --- version 3: retrieval figures (rag, bm25; null for the other methods) ---
    ("retrieval_chunks", pa.int64(), "Chunks the document was cut into and ranked (rag, bm25); 0 when it fit the budget and was kept whole."),
    ("retrieved_chunks", pa.int64(), "Ranked chunks kept in the context, in document order (the last one taken may be cut to fill the budget)."),
    ("retrieval_top_score", pa.float64(), "Best chunk score: cosine similarity to the query (rag) or BM25 (bm25); null when nothing was ranked."),
    ("retrieval_mean_score", pa.float64(), "Mean score of the kept chunks (as retrieval_top_score); null when nothing was ranked."),
    ("embedder_truncated_chunks", pa.int64(), "rag: ranked chunks longer than the embedder's window (max_seq_length word pieces), scored on their head only; 0 with the default chunk_tokens (auto)."),
]

# Never null, error rows included: a row without them cannot be found, resumed or joined.
IDENTITY_COLUMNS = ("run_id", "run_date", "job", "doc_id", "request_id", "schema_version")
# In the folder name only (hive partitioning), never inside the files.
PARTITION_COLUMNS = ("run_date",)

OUTPUT_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field(name, typ, nullable=name not in IDENTITY_COLUMNS, metadata={"description": doc})
        for name, typ, doc in _COLUMNS
    ],
    metadata={"longdoc.schema_version": str(SCHEMA_VERSION)},
)
"""The table as readers see it (the partition column included)."""
FILE_SCHEMA: pa.Schema = pa.schema(
    [f for f in OUTPUT_SCHEMA if f.name not in PARTITION_COLUMNS], metadata=OUTPUT_SCHEMA.metadata
)
"""What every Parquet file holds: OUTPUT_SCHEMA minus the partition column."""
COLUMN_DOCS: dict[str, str] = {name: doc for name, _, doc in _COLUMNS}
OUTPUT_COLUMNS: list[str] = [name for name, _, _ in _COLUMNS]
FILE_COLUMNS: list[str] = FILE_SCHEMA.names

# Exception classes (matched by name anywhere in the MRO, so schemas/ imports neither
# Ray nor torch) that mean the request itself is bad. Everything else is retryable:
# wrongly retrying costs one more attempt, wrongly calling an error final loses the row.
_INPUT_EXCEPTIONS = frozenset({"UnicodeError", "JSONDecodeError"})
_RETRYABLE_EXCEPTIONS = frozenset({
    "MemoryError", "OutOfMemoryError", "OSError", "TimeoutError", "ConnectionError",
    "RayError", "RayActorError", "ActorDiedError", "WorkerCrashedError", "ObjectLostError",
})  # fmt: skip


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


def classify_error(err: BaseException | str | None) -> str:
    """``error_kind`` of a failure: INPUT (final) or RETRYABLE (a rerun retries it).

    Exceptions are classified by type: out of memory, storage (OSError), timeouts,
    connection and Ray actor/worker/object losses are RETRYABLE; Unicode/JSON decoding
    errors are INPUT; anything unknown is RETRYABLE. A message (str) or None says
    nothing about its origin and is RETRYABLE: a raise site that knows the cause
    passes ``kind=`` (stages.rows.fail) instead of relying on this default.
    """
    if isinstance(err, BaseException):
        names = {cls.__name__ for cls in type(err).__mro__}
        if names & _INPUT_EXCEPTIONS:
            return INPUT
        if names & _RETRYABLE_EXCEPTIONS:
            return RETRYABLE
    return RETRYABLE


def is_retried(error_kind: str | None, policy: str) -> bool:
    """Whether a failed row is retried by a rerun under ``--retry-errors policy``.

    policy: ``all`` (every error row), ``retryable`` (error_kind retryable, or unknown:
    rows written before error_kind existed) or ``none``.
    """
    if policy not in RETRY_POLICIES:
        raise ValueError(f"--retry-errors {policy!r} is not one of {', '.join(RETRY_POLICIES)}")
    if policy == "all":
        return True
    return policy == "retryable" and error_kind != INPUT


RETRY_POLICIES = ("all", "retryable", "none")


def empty_row() -> dict[str, Any]:
    """A row with every column present and null, to be filled by the stages."""
    return dict.fromkeys(OUTPUT_COLUMNS)


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema = OUTPUT_SCHEMA) -> pa.Table:
    """Build a table with exactly ``schema`` (OUTPUT_SCHEMA or FILE_SCHEMA).

    Unknown keys are dropped, missing ones are null; ``schema_version`` is set to
    SCHEMA_VERSION and a failed row without ``error_kind`` gets ``classify_error``'s
    default. Raises ValueError naming the column and request when an identity column
    is null (an upstream bug: every row, error rows included, carries its identity).
    """
    cols: dict[str, list[Any]] = {name: [r.get(name) for r in rows] for name in schema.names}
    if "schema_version" in cols:
        cols["schema_version"] = [SCHEMA_VERSION] * len(rows)
    if "error_kind" in cols:
        cols["error_kind"] = [
            (kind or classify_error(err)) if err is not None else None
            for kind, err in zip(cols["error_kind"], cols["error"])
        ]
    for name in IDENTITY_COLUMNS:
        if name in cols and None in cols[name]:
            bad = rows[cols[name].index(None)]
            raise ValueError(
                f"output row {bad.get('request_id')!r} (doc {bad.get('doc_id')!r}) has no {name}: "
                f"identity columns {', '.join(IDENTITY_COLUMNS)} must be set on every row"
            )
    return pa.Table.from_pydict(cols, schema=schema)
