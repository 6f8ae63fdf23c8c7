"""The answers themselves, for a person reading a run in a terminal (`longdoc report --answers N`).

The summary counts rows; this prints what they said: each row's document, question (or
summary instruction), answer, and its reference or error. Rows come from the newest run
date, in document order, so the same output prints the same lines. Analysts with many rows
read the Parquet table instead (README, "Reading the output"). What a document or a model
wrote is printed with its control characters as escapes (pipeline/report/safe_text.py).
"""

from __future__ import annotations

import textwrap

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.safe_text import printable
from pipeline.report.summary import contains_reference

#: Characters of one field before it is cut (a summary can be long; the table has it whole).
FIELD_CHARS = 600


def _field(label: str, text: str) -> str:
    cut = text if len(text) <= FIELD_CHARS else text[:FIELD_CHARS].rstrip() + " [...]"
    return textwrap.fill(printable(" ".join(cut.split())), width=100, initial_indent=f"  {label}: ",
                         subsequent_indent=" " * (len(label) + 4))


#: What ``answer_rows`` keeps of a row (``--answers N --json``).
ANSWER_FIELDS = ("run_date", "doc_id", "prompt", "output_text", "finish_reason", "error", "error_kind", "reference")


def newest_rows(table: pa.Table) -> tuple[str, pa.Table]:
    """The newest ``run_date`` of ``table`` and its rows, in document order (a stable order)."""
    newest = pc.max(table.column("run_date")).as_py()
    rows = table.filter(pc.equal(table.column("run_date"), newest))
    return newest, rows.take(pc.sort_indices(rows, [("doc_id", "ascending"), ("prompt", "ascending")]))


def answer_rows(table: pa.Table, limit: int) -> list[dict]:
    """``format_answers``' rows as dicts (``ANSWER_FIELDS``), for ``--json``."""
    _, rows = newest_rows(table)
    return rows.slice(0, limit).select(list(ANSWER_FIELDS)).to_pylist()


def format_answers(table: pa.Table, limit: int) -> str:
    """At most ``limit`` rows of the newest ``run_date`` in ``table`` (the output schema), as
    text blocks: ``[doc_id] prompt`` then ``answer`` (marked when the token limit stopped
    it) or ``error (kind)``, and ``reference``
    with whether the answer contains it (the report's own comparison) when one exists.
    The heading says how many rows the date has and how many are shown."""
    newest, rows = newest_rows(table)
    shown = rows.slice(0, limit).to_pylist()
    more = " (--answers N for more)" if len(shown) < rows.num_rows else ""
    lines = [f"answers of {newest}: {len(shown)} of {rows.num_rows} row(s){more}"]
    for r in shown:
        # The id as it is, escapes written out: a newline in it forged a report line.
        lines.append(f"[{printable(r['doc_id'])}] {printable(' '.join((r.get('prompt') or '').split()))}")
        if r.get("error") is not None:
            lines.append(_field(f"error ({r.get('error_kind') or '-'})", r["error"]))
        else:  # an answer the token limit stopped may end mid-sentence: say so where it is read
            cut = " (cut at max_new_tokens)" if r.get("finish_reason") == "length" else ""
            lines.append(_field(f"answer{cut}", r.get("output_text") or ""))
        if r.get("reference") is not None:
            verdict = "contains it" if contains_reference(r["reference"], r.get("output_text")) else "does not"
            lines.append(_field(f"reference ({verdict})", r["reference"]))
    return "\n".join(lines)
