"""The output table: one Parquet row per request. Column names are a contract.

The columns are defined exactly once, here, as the fields of ``OutputRow``: name,
order, Python type (non-null identity columns have no ``None``), Arrow type, definition
and where the value comes from. ``OUTPUT_SCHEMA``, ``FILE_SCHEMA``, ``COLUMN_DOCS`` and
the column lists are derived from it, and ``output_row`` is the one function that
builds a row (success or error) for every writer. Code that computes a figure cites
this module. The schema is explicit (never inferred from data) so that files from
different runs and workers always union cleanly.

Adding a column: append a field to ``OutputRow``, bump ``SCHEMA_VERSION``, record the
version in ``tests/schemas/output_schema_snapshot.json``, and fill the value where it
is measured (a figure: a keyword of ``output_row`` or ``set_figures`` in stages/generate.py; a value the
request carries, ``from_request``: a field of its row type in schemas/rows.py, set by
the stage that knows it, e.g. stages/requests.py). Files written before it hold null
there: `longdoc upgrade` gives them the column, and only a rerun with other settings
rewrites their rows.

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

import re
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, get_args, get_type_hints

import pyarrow as pa

if TYPE_CHECKING:
    from collections.abc import Mapping

    from schemas.spec import JobSpec

SCHEMA_VERSION = 10

INPUT = "input"  # final: the same input fails the same way on every rerun
RETRYABLE = "retryable"  # infrastructure: a rerun may succeed
ERROR_KINDS = (INPUT, RETRYABLE)


@dataclass(frozen=True)
class Column:
    """How one output column is stored and filled; its definition is ``doc``.

    ``arrow``: the Arrow type, when not the default of the column's Python type
    (str -> string, int -> int64, float -> float64). Where ``output_row`` takes the
    value from: ``from_request`` = the request row as it reaches the writer (identity
    and what was asked, copied as is); ``from_spec`` = a dotted attribute path of the
    JobSpec (a setting of the run); neither = a figure the generate stage passes.
    """

    doc: str
    arrow: pa.DataType | None = None
    from_request: bool = False
    from_spec: str | None = None


_REQUEST = {"from_request": True}


class OutputRow(TypedDict):
    """One row of the output table, and the ONE definition of its columns.

    Field order is the column order in files; a type without ``None`` is a non-null
    identity column (error rows too); the ``Column`` marker holds the definition
    (``COLUMN_DOCS``, each Parquet field's ``description``) and where the value comes
    from. ``OUTPUT_SCHEMA``, ``COLUMN_DOCS`` and ``output_row`` are derived from it.
    Columns are only ever appended (see the module docstring).
    """

    run_id: Annotated[str, Column("Identifier of the run that wrote the row.", **_REQUEST)]
    run_date: Annotated[str, Column("Logical date of the run (YYYY-MM-DD). Hive partition: in the folder name run_date=..., not in the files.", **_REQUEST)]
    job: Annotated[str, Column("JobSpec.name.", **_REQUEST)]
    doc_id: Annotated[str, Column("Document id (file path relative to the input root, or id_field).", **_REQUEST)]
    request_id: Annotated[str, Column("Stable hash of (doc_id, prompt, document text, generation settings, compression).", **_REQUEST)]
    source_uri: Annotated[str | None, Column("URI of the file the document was read from.", **_REQUEST)]
    task: Annotated[str | None, Column("summarize | qa.", **_REQUEST)]
    prompt: Annotated[str | None, Column("The question (qa) or the summary instruction (summarize).", **_REQUEST)]
    reference: Annotated[str | None, Column("Reference answer from input.answer_field, if any (evaluation only); a question with several acceptable answers (a list in the input) holds them joined by ' | ' (a ' | ' inside one answer is written ' \\| '), and an answer matching any counts.", **_REQUEST)]
    output_text: Annotated[str | None, Column("Generated text (stop strings, EOS and the whitespace around it removed). Null on error.")]
    model: Annotated[str | None, Column("Generating model as named in the spec.", from_spec="generation.model")]
    compression: Annotated[str | None, Column("Compression method: a registered method name (`longdoc methods` lists them: none, truncate, rag, bm25, finch, autocompressor, ...).", from_spec="compression.method")]
    speculative: Annotated[str | None, Column("Decoding method (generation.speculative.method): none, or a drafter's name (prompt_lookup, suffix, ...).", from_spec="generation.speculative.method")]
    doc_tokens: Annotated[int | None, Column("Document length in the generating model's tokens.", **_REQUEST)]
    context_tokens: Annotated[int | None, Column("Document tokens (or KV entries / summary vectors) the model conditioned on after compression.")]
    compression_ratio: Annotated[float | None, Column("doc_tokens / context_tokens (1.0 for none). Over several rows: sum(doc_tokens) / sum(context_tokens), not a mean of this column (a row keeping a few tokens would outweigh the rest).")]
    prompt_tokens: Annotated[int | None, Column("Tokens prefilled for generation: chat template + context + question.")]
    output_tokens: Annotated[int | None, Column("Generated tokens, including the EOS token if one was produced.")]
    draft_tokens: Annotated[int | None, Column("Draft tokens proposed by speculation and sent for verification.")]
    accepted_tokens: Annotated[int | None, Column("Draft tokens accepted by verification (bonus tokens not counted).")]
    acceptance_rate: Annotated[float | None, Column("accepted_tokens / draft_tokens; null when nothing was drafted.")]
    decode_steps: Annotated[int | None, Column("Target-model forward passes after prefill that this row took part in.")]
    mean_accepted_per_step: Annotated[float | None, Column("output_tokens / (decode_steps + 1): tokens emitted per forward pass, prefill's first token included.")]
    compress_s: Annotated[float | None, Column("Seconds spent compressing the context; additive over rows. A text method (one that compresses before the engine, e.g. truncate, rag, bm25: `longdoc methods` says where each runs): the row's time in the stage before the engine (rag: plus its share of its batch's embedding), not in device_s but charged in cost_usd. A method reading inside the engine's prefill (e.g. finch, select, autocompressor): its reading, PART OF prefill_s (and so of device_s): do not add it to prefill_s. Null on error.")]
    prefill_s: Annotated[float | None, Column("Seconds of this row's prefill in the generate actor's engine (a method prefill of several rows split evenly over them); part of device_s, and it holds an in-engine method's compress_s; additive over rows.")]
    ttft_s: Annotated[float | None, Column("Seconds from the row's arrival at the generate actor's engine to its first generated token (queue_s and prefill included). Latency: rows served together overlap, so a sum over rows is not time spent.")]
    decode_s: Annotated[float | None, Column("Seconds from the first generated token to this row's last one (stall_s included). Latency, as ttft_s: not additive over rows; the row's device share of decoding is device_s - prefill_s.")]
    e2e_s: Annotated[float | None, Column("Text compression seconds (a text method's compress_s, e.g. truncate, rag, bm25) + ttft_s + decode_s: the row's latency, not additive over rows.")]
    device: Annotated[str | None, Column("cpu | cuda:<name> of the generate actor.")]
    device_s: Annotated[float | None, Column("This row's share of the generate actor's device time: its prefill_s plus each decode step's time divided by the rows in that step; additive over rows (their sum is the actor's busy time). A text method's compress_s (before the engine) is not in it.")]
    cost_usd: Annotated[float | None, Column("(device_s + the compress_s of a text method, one that compresses before the engine) * cost.usd_per_device_hour / 3600: the generate actor's time and the text stage's, at one price; additive over rows. Error rows: device_s only.")]
    error: Annotated[str | None, Column("Null on success; otherwise a readable message naming the stage and the problem.")]
    # --- version 2 (columns are only appended; see the module docstring) ---
    error_kind: Annotated[str | None, Column("Null on success; input (final: the request itself is bad) or retryable (infrastructure: a rerun of the date retries it).")]
    schema_version: Annotated[int, Column("Version of this schema the row was written with (schemas.output.SCHEMA_VERSION).", arrow=pa.int32())]
    # --- version 3: retrieval figures (rag, bm25; null for the other methods) ---
    retrieval_chunks: Annotated[int | None, Column("Chunks the document was cut into and ranked (rag, bm25); 0 when it fit the budget and was kept whole.")]
    retrieved_chunks: Annotated[int | None, Column("Ranked chunks kept in the context, in document order (the last one taken may be cut to fill the budget).")]
    retrieval_top_score: Annotated[float | None, Column("Best chunk score: cosine similarity to the query (rag) or BM25 (bm25); null when nothing was ranked.")]
    retrieval_mean_score: Annotated[float | None, Column("Mean score of the kept chunks (as retrieval_top_score); null when nothing was ranked.")]
    embedder_truncated_chunks: Annotated[int | None, Column("rag: ranked chunks longer than the embedder's window (max_seq_length word pieces), scored on their head only; 0 with the default chunk_tokens (auto).")]
    # --- version 4: the engine's waits ---
    queue_s: Annotated[float | None, Column("Seconds from the row's arrival at the generate actor's engine to the start of its prefill (waiting for a slot or KV memory); part of ttft_s, a wait: not additive over rows.")]
    stall_s: Annotated[float | None, Column("Seconds this row, while decoding, waited for other rows' prefill (newcomers' prompts are prefilled in chunks between decode steps; this is what remains); part of decode_s, a wait: not additive over rows.")]
    # --- version 5: the prefix cache ---
    cached_prompt_tokens: Annotated[int | None, Column("Prompt tokens whose keys and values came from the generate actor's prefix cache instead of a prefill: the chat template and context before the question, prefilled once per document and reused by its other questions (generation.prefix_cache); 0 when this row prefilled them itself.")]
    # --- version 6: what the reader read of the document ---
    kept_spans: Annotated[list[int] | None, Column("Document token positions the model conditioned on, as flattened half-open [start, end) pairs in document order ([s0, e0, s1, e1, ...], positions into the document's doc_tokens): the kept text of a text method, the positions of the kept keys/values (or re-prefilled tokens) of a prefill method that reports them, [0, doc_tokens] for none. Null when the method keeps no document positions (AutoCompressor summaries) or does not report them. The eval's evidence recall reads it (pipeline/eval/recall.py).", arrow=pa.list_(pa.int64()))]
    # --- version 7: the text the model read (output.keep_context) ---
    context: Annotated[str | None, Column("The document text the model read, decoded from the tokens it was given: the kept text of a text method (e.g. truncate, rag, bm25, in the order prefilled), the tokens a method prefilled after picking them (select; finch in mode early_exit), the whole document for none. Null unless output.keep_context is on, on error, and for methods that keep keys/values or summary vectors instead of text (finch in its paper's mode kv, autocompressor: kept_spans says what they kept).")]
    # --- version 8: why generation stopped ---
    finish_reason: Annotated[str | None, Column("Why generation stopped: eos (the model ended its answer), stop (a generation.stop string; cut from output_text), repeat (generation.repeat_guard cut a loop), length (generation.max_new_tokens reached: the text may be cut off mid-sentence). Null on error.")]
    # --- version 9: the budget beside the method ---
    target_tokens: Annotated[int | None, Column("compression.target_tokens of the run: the method's budget of document tokens shown to the generator (context_tokens is what it kept). Null for none, and in rows written before schema version 9.", from_spec="compression.budget_tokens")]
    # --- version 10: how the text was drawn ---
    temperature: Annotated[float | None, Column("generation.temperature of the run: 0 = greedy decoding (the same text on every rerun); above 0 the text was sampled (top_p and top_k are in the run record). Null in rows written before schema version 10.", from_spec="generation.temperature")]
    seed: Annotated[int | None, Column("generation.seed of the run: with temperature above 0 a row's text follows from it and its request alone, speculation on or off. Null in rows written before schema version 10.", from_spec="generation.seed")]


_DEFAULT_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64()}


def _columns_of(row_type: type) -> list[tuple[str, pa.DataType, bool, Column]]:
    """(name, arrow type, nullable, Column) per field of ``row_type``, in order."""
    out = []
    for name, hint in get_type_hints(row_type, include_extras=True).items():
        value_type, column = get_args(hint)  # Annotated[<python type>, Column(...)]
        types = set(get_args(value_type)) or {value_type}  # str | None -> {str, NoneType}
        nullable = type(None) in types
        (py_type,) = types - {type(None)}
        out.append((name, column.arrow or _DEFAULT_ARROW[py_type], nullable, column))
    return out


_COLUMNS = _columns_of(OutputRow)

# Never null, error rows included: a row without them cannot be found, resumed or joined.
IDENTITY_COLUMNS = tuple(name for name, _, nullable, _ in _COLUMNS if not nullable)
# In the folder name only (hive partitioning), never inside the files.
PARTITION_COLUMNS = ("run_date",)
#: Columns ``output_row`` copies from the request row, and those it reads from the spec.
REQUEST_COLUMNS = tuple(name for name, *_, col in _COLUMNS if col.from_request)
SPEC_COLUMNS: dict[str, str] = {name: col.from_spec for name, *_, col in _COLUMNS if col.from_spec}
#: Columns the generate stage fills (``output_row``'s keyword figures).
FIGURE_COLUMNS = tuple(
    name for name, *_, col in _COLUMNS
    if not col.from_request and not col.from_spec and name not in ("error", "error_kind", "schema_version")
)

OUTPUT_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field(name, typ, nullable=nullable, metadata={"description": col.doc})
        for name, typ, nullable, col in _COLUMNS
    ],
    metadata={"longdoc.schema_version": str(SCHEMA_VERSION)},
)
"""The table as readers see it (the partition column included)."""
FILE_SCHEMA: pa.Schema = pa.schema(
    [f for f in OUTPUT_SCHEMA if f.name not in PARTITION_COLUMNS], metadata=OUTPUT_SCHEMA.metadata
)
"""What every Parquet file holds: OUTPUT_SCHEMA minus the partition column."""
COLUMN_DOCS: dict[str, str] = {name: col.doc for name, *_, col in _COLUMNS}
OUTPUT_COLUMNS: list[str] = [name for name, *_ in _COLUMNS]

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


#: Between the acceptable answers of one question in the ``reference`` column.
REFERENCE_SEPARATOR = " | "


#: What the separator becomes inside one answer ("billing-db | 740" is one answer, not two).
ESCAPED_SEPARATOR = " \\| "


def reference_text(answer: Any) -> str | None:
    """The ``reference`` of one input answer: a string as it is, a list of acceptable answers
    joined by ``REFERENCE_SEPARATOR`` (nulls dropped), None for none. An answer holding the
    separator itself has it escaped (``ESCAPED_SEPARATOR``), so it stays one answer."""
    if answer is None:
        return None
    if isinstance(answer, (list, tuple)):
        alternatives = [str(a).replace(REFERENCE_SEPARATOR, ESCAPED_SEPARATOR) for a in answer if a is not None]
        return REFERENCE_SEPARATOR.join(alternatives) if alternatives else None
    return str(answer).replace(REFERENCE_SEPARATOR, ESCAPED_SEPARATOR)


def reference_alternatives(reference: str) -> list[str]:
    """The acceptable answers a ``reference`` holds (``reference_text``'s inverse)."""
    alternatives = [a.replace(ESCAPED_SEPARATOR, REFERENCE_SEPARATOR)
                    for a in reference.split(REFERENCE_SEPARATOR) if a.strip()]
    return alternatives or [reference]


def cost_usd(device_s: float, usd_per_device_hour: float, text_compress_s: float = 0.0) -> float:
    """The ``cost_usd`` of ``device_s`` seconds of the generate actor plus ``text_compress_s``
    seconds of text compression before it (a text method's ``compress_s``), both at
    ``usd_per_device_hour``. An in-engine method's compress_s is inside ``device_s``
    already: passing it as ``text_compress_s`` would count it twice."""
    return (device_s + text_compress_s) * usd_per_device_hour / 3600.0


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


_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt|Warning)\b(:|$)")
_ACTOR = re.compile(r"ray::MapWorker\(MapBatches\((\w+?)(Stage)?\)\)\.__init__")


def raised_last(text: str) -> str | None:
    """The exception a traceback's ``text`` ends in, ``Type: message`` joined onto one line
    (its message may span lines); None when no line of it names an exception."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [i for i, ln in enumerate(lines) if _RAISED.match(ln)]
    return " ".join(lines[raised[-1]:]) if raised else None


def error_cause(err: BaseException, limit: int = 500) -> str:
    """What a failure was, in one line of at most ``limit`` characters: ``Type: message`` of
    the exception raised last inside a (possibly wrapped, multi-line) Ray error, from its
    line to the end, and the stage whose actor could not start (a Ray actor's creation
    failure quotes the whole traceback: an abort printed 2,000 characters of it, cut before
    the cause). A plain exception: its type and its whole message on one line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    raised = raised_last(str(err)) if len(lines) > 1 else None  # a wrapped traceback's own exception
    cause = raised or f"{type(err).__name__}: {' '.join(lines) or 'no message'}"
    actor = _ACTOR.search(str(err))
    if actor:
        cause = f"the {actor.group(1).lower()} stage's actor could not start: {cause}"
    return cause[:limit]


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


def output_row(
    spec: JobSpec,
    request: Mapping[str, Any],
    *,
    error: str | None = None,
    error_kind: str | None = None,
    **figures: Any,
) -> OutputRow:
    """Build one output row, success or error: the one place a row is put together.

    ``request``: the request row as it reached the writer (a RequestRow or a later hop
    of schemas/rows.py); ``REQUEST_COLUMNS`` are copied from it (absent ones null).
    ``spec``: the run's JobSpec; ``SPEC_COLUMNS`` are read from it. ``error``: set for a
    failed row; its ``error_kind`` is the one given, else the request's own (an
    upstream stage's failure keeps the kind its stage gave it), else ``classify_error``'s
    default in ``rows_to_table``. ``figures``: values of ``FIGURE_COLUMNS`` by name
    (the generate stage's measurements; absent ones null). Raises ValueError naming an
    unknown figure and the allowed names, so a misspelt column cannot vanish silently.
    """
    row: dict[str, Any] = dict.fromkeys(OUTPUT_COLUMNS)
    for name in REQUEST_COLUMNS:
        row[name] = request.get(name)
    for name, path in SPEC_COLUMNS.items():
        row[name] = attrgetter(path)(spec)
    set_figures(row, **figures)  # type: ignore[arg-type]
    row["error"] = error
    row["error_kind"] = (error_kind or request.get("error_kind")) if error else None
    row["schema_version"] = SCHEMA_VERSION
    return row  # type: ignore[return-value]


def set_figures(row: OutputRow, **figures: Any) -> OutputRow:
    """Set ``FIGURE_COLUMNS`` of a built row by name (what the generate stage learns after
    ``output_row``: the device, its seconds, the cost); returns ``row``. Raises ValueError
    naming an unknown figure, as ``output_row`` does: ``rows_to_table`` drops unknown keys,
    so a misspelt column set by item would vanish silently."""
    if unknown := sorted(set(figures) - set(FIGURE_COLUMNS)):
        raise ValueError(
            f"{', '.join(unknown)} not a figure column of the output row; allowed: {', '.join(FIGURE_COLUMNS)}"
        )
    row.update(figures)  # type: ignore[typeddict-item]
    return row


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
