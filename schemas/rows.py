"""The rows that travel between stages, as types: one TypedDict per hop.

A request is one document x one task prompt (summarize) or question (qa). Its row
grows column by column on the way to the output table::

    read ------> RequestRow      (stages/requests.py: expand_requests)
    tokenize --> TokenizedRow    (stages/tokenize.py: TokenizeStage)
    text compression -> CompressedRow  (a method with runs_at tokenize or text_stage,
                                        stages/compression/; RetrievedRow for rag, bm25)
    generate --> OutputRow       (stages/generate.py: GenerateStage; defined in schemas/output.py)
    write -----> Parquet         (stages/write.py)

Each stage's signature names the row it takes and returns; each stage and method
declares the columns it needs and adds (``needs``/``adds``), and the plan checks the
chain before anything loads (pipeline/plan.py). tests/schemas/test_rows.py checks
the declarations against these types and ``OutputRow`` against the output schema.

Contract: a stage never drops a row. A row whose ``error`` is set passes through
untouched (the columns a stage would add stay null); a row that fails in a stage gets
``error = "<stage>: <message>"`` and ``error_kind`` (stages/rows.fail). Ray Data
hands the rows over as numpy batches; stages/rows.py converts.
"""

from __future__ import annotations

from typing import TypedDict

# The output row is defined once, with its column definitions, in schemas/output.py.
from schemas.output import OutputRow as OutputRow


class RequestRow(TypedDict):
    """One request as expanded (stages/requests.py); identity columns as in schemas/output.py."""

    request_id: str  # stable hash of document, prompt and settings (reruns skip it)
    run_id: str
    run_date: str  # YYYY-MM-DD
    job: str
    doc_id: str
    source_uri: str
    task: str  # summarize | qa
    prompt: str | None  # the question (qa) or the instruction (summarize); None: a qa document with no question
    instruction: str  # the task instruction (task.resolved_instruction)
    question: str | None  # None for summarize
    reference: str | None  # reference answer (input.answer_field), for evaluation
    text: str | None  # the document; None when reading it failed
    error: str | None
    error_kind: str | None  # schemas.output.INPUT | RETRYABLE when error is set
    # requests of this document the run sends (those not already done): the engine holds a
    # document's first requests until the rest are queued, to read it once (scheduler.py)
    doc_requests: int


class TokenizedRow(RequestRow):
    """After tokenize: the whole document in the generating model's tokens."""

    doc_ids: list[int] | None  # None when the row failed before or here
    doc_tokens: int | None


class CompressedRow(TokenizedRow):
    """After a text compression (any method that compresses before the engine: truncate, rag, ...): what the model will read instead."""

    context_ids: list[int] | None  # a subsequence of doc_ids, at most target_tokens long
    context_tokens: int | None
    # where context_ids sit in doc_ids: flattened half-open [start, end) pairs in document
    # order (the output's kept_spans, schemas/output.py)
    context_spans: list[int] | None
    compress_s: float | None  # seconds this row's compression took (its share of a batch)


class RetrievedRow(CompressedRow):
    """After a chunk-retrieval compression (rag, bm25): the retrieval figures too
    (definitions in schemas/output.py; a method declares the ones it fills in ``adds``)."""

    retrieval_chunks: int | None  # chunks ranked; 0 when the document fit the budget
    retrieved_chunks: int | None  # chunks kept (the last may be cut)
    retrieval_top_score: float | None
    retrieval_mean_score: float | None
    embedder_truncated_chunks: int | None  # rag only: chunks over the embedder's window


#: What generate reads: a tokenized row, text-compressed or not.
GenerateInput = TokenizedRow | CompressedRow | RetrievedRow

# The model stages' column declarations live here, beside their rows, so the plan checks
# the chain without importing the stages (torch, transformers: the driver needs neither).
#: stages/tokenize.py TokenizeStage
TOKENIZE_NEEDS: tuple[str, ...] = ("text", "error", "instruction", "question")
TOKENIZE_ADDS: tuple[str, ...] = ("doc_ids", "doc_tokens")
#: stages/generate.py GenerateStage (it adds every OutputRow column: ``columns(OutputRow)``)
GENERATE_NEEDS: tuple[str, ...] = ("request_id", "doc_ids", "instruction", "question", "error")


def columns(row_type: type) -> tuple[str, ...]:
    """The column names of a row TypedDict, in declaration order (inherited ones first)."""
    return tuple(row_type.__annotations__)
