"""Row contracts (schemas/rows.py): OutputRow is the output schema, read makes a
RequestRow, and every stage's and method's declared columns agree with the row types,
so the plan's chain check (pipeline/plan.py) checks the real thing."""

from __future__ import annotations

import types
import typing

import pyarrow as pa
import pytest

from pipeline.plan import GENERATE, READ, TOKENIZE, WRITE, StageColumns, check_chain, stage_chain
from schemas.loading import spec_from_dict
from schemas.output import OUTPUT_COLUMNS, OUTPUT_SCHEMA
from schemas.rows import CompressedRow, OutputRow, RequestRow, RetrievedRow, TokenizedRow, columns
from stages.compression import registry
from stages.compression.base import CONTEXT_COLUMNS
from stages.generate import GenerateStage
from stages.read import Document
from stages.requests import expand_requests, generation_fingerprint
from stages.tokenize import TokenizeStage

PY_TYPES = {pa.string(): str, pa.int64(): int, pa.int32(): int, pa.float64(): float, pa.list_(pa.int64()): list[int]}


def _spec(method: str = "none", **compression):
    config = {"method": method, **compression}
    fields = registry()[method].spec_model.model_fields
    config.update({k: "x" for k, f in fields.items() if f.is_required() and k != "method"})
    return spec_from_dict(
        {"name": "j", "input": {"uri": "/in"}, "task": {"kind": "qa", "questions": ["Q?"]}, "compression": config}
    )


def test_output_row_is_the_output_schema() -> None:
    assert columns(OutputRow) == tuple(OUTPUT_COLUMNS)  # names and order
    hints = typing.get_type_hints(OutputRow)
    for field in OUTPUT_SCHEMA:
        hint = hints[field.name]
        args = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
        assert PY_TYPES[field.type] in args, (field.name, hint, field.type)
        assert (type(None) in args) == field.nullable, (field.name, hint, field.nullable)


def test_row_types_grow_hop_by_hop() -> None:
    hops = (RequestRow, TokenizedRow, CompressedRow, RetrievedRow)
    request, tokenized, compressed, retrieved = map(set, map(columns, hops))
    assert request < tokenized < compressed < retrieved
    assert tokenized - request == set(TokenizeStage.adds)
    assert compressed - tokenized == set(CONTEXT_COLUMNS)
    assert retrieved - compressed <= set(OUTPUT_COLUMNS)  # figures reach the output as they are


def test_every_column_copied_from_the_request_is_carried_by_a_row_type() -> None:
    """A column marked ``from_request`` that no hop's row carries would be null for ever, and
    no other test would notice (a trial added one and left it out of RequestRow)."""
    from schemas.output import REQUEST_COLUMNS

    carried = set(columns(RetrievedRow))  # every hop's columns (each row type grows from the last)
    assert set(REQUEST_COLUMNS) <= carried, set(REQUEST_COLUMNS) - carried


def test_read_makes_request_rows() -> None:
    spec = _spec()
    doc = Document("d", "file:///in/d.txt", "Some text.")
    rows = expand_requests(doc, spec, "run", "2026-01-01", generation_fingerprint(spec))
    assert rows and all(set(r) == set(columns(RequestRow)) for r in rows)


def test_stage_declarations_match_the_row_types() -> None:
    assert set(TokenizeStage.needs) <= set(columns(RequestRow))
    assert set(GenerateStage.needs) <= set(columns(TokenizedRow))
    assert set(GenerateStage.adds) == set(OUTPUT_COLUMNS)
    assert READ.adds == columns(RequestRow) and WRITE.needs == columns(OutputRow)


@pytest.mark.parametrize("method", list(registry()))
def test_method_declarations_match_the_row_types(method: str) -> None:
    m = registry()[method]
    assert set(m.needs) <= set(columns(TokenizedRow)), m.needs
    if m.runs_at == "prefill":  # reports context_tokens/compress_s through CompressedPrefill
        assert m.adds == ()
    else:  # text compression: the CompressedRow columns, retrieval figures for rag/bm25
        assert set(CONTEXT_COLUMNS) <= set(m.adds) <= set(columns(RetrievedRow))


@pytest.mark.parametrize("method", list(registry()))
def test_every_method_chain_checks(method: str) -> None:
    chain = stage_chain(_spec(method))
    assert [s.name for s in chain][:2] == ["read", "tokenize"] and chain[-2:] == [GENERATE, WRITE]
    check_chain(chain)


def test_a_broken_chain_names_the_stage_and_the_columns() -> None:
    needy = StageColumns("compression 'x' (text_stage)", ("doc_ids", "summary"), CONTEXT_COLUMNS)
    with pytest.raises(ValueError, match=r"compression 'x'.*\['summary'\]"):
        check_chain([READ, TOKENIZE, needy, GENERATE, WRITE])
    with pytest.raises(ValueError, match=r"generate.*doc_ids"):
        check_chain([READ, GENERATE])
