"""Run summaries: one definition of every aggregate, for `longdoc run` and `report`.

Contract: ``summarize(table, wall_s)`` takes any table with the output schema's
figure columns (text columns optional) and returns a flat dict; throughput figures
use ``wall_s`` when the run's wall time is known, else the summed device seconds
(stated in ``throughput_basis``). ``format_summary`` renders it as an aligned table.

``run_summary`` adds what `longdoc run` records for one run: ``status``
(``succeeded``: the date has no error row; ``partial``: the run completed but some rows
of the date failed; ``failed``: Ray aborted the run, its unfinished requests are
retryable error rows), ``errors_by_kind`` (this run's rows) and the date as a whole
(``date_rows``, ``date_failed``, ``date_failed_fraction``, ``date_errors_by_kind``: each
request once, after retried rows replaced old ones). ``run_record_json`` is the bytes
of the run record (``{output}.runs/{date}/{run_id}.json``, stages/layout.py
``run_record_path``); ``package_versions`` the versions it carries.
"""

from __future__ import annotations

import json
import platform
import re
from importlib import metadata
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.output import ERROR_KINDS

VERSIONED_PACKAGES = ("longdoc", "torch", "transformers", "ray", "pyarrow", "fsspec")


def _quantile(col: pa.ChunkedArray, q: float) -> float | None:
    vals = pc.drop_null(col)
    if len(vals) == 0:
        return None
    return float(pc.quantile(vals, q=q, interpolation="linear")[0].as_py())


def _sum(table: pa.Table, col: str) -> float:
    v = pc.sum(table.column(col)).as_py()
    return float(v or 0)


def _normalized(text: str) -> str:
    """Lowercase, words only, single spaces: how answers are compared with their reference."""
    return " ".join(re.findall(r"\w+", text.lower()))


def score_answers(table: pa.Table) -> dict[str, Any]:
    """Answers against ``reference`` where one exists (input.answer_field): ``answers_scored``
    (rows with a reference, failed rows count as wrong), ``answers_contain`` (fraction whose
    normalized answer contains the normalized reference) and ``answers_exact`` (equal after
    normalizing). Empty when the table has no reference (or no text columns)."""
    if table.num_rows == 0 or not {"reference", "output_text"} <= set(table.column_names):
        return {}
    pairs = [(r, o) for r, o in zip(table.column("reference").to_pylist(), table.column("output_text").to_pylist(),
                                    strict=True) if r is not None]
    if not pairs:
        return {}
    refs = [(_normalized(r), _normalized(o or "")) for r, o in pairs]
    return {
        "answers_scored": len(refs),
        "answers_contain": sum(bool(r) and r in o for r, o in refs) / len(refs),
        "answers_exact": sum(r == o for r, o in refs) / len(refs),
    }


def summarize(table: pa.Table, wall_s: float | None = None) -> dict[str, Any]:
    rows = table.num_rows
    errors = table.column("error")
    failed = rows - int(pc.sum(pc.is_null(errors)).as_py() or 0) if rows else 0
    ok_table = table.filter(pc.is_null(errors)) if rows else table
    docs = len(pc.unique(table.column("doc_id"))) if rows else 0
    out_tokens = _sum(ok_table, "output_tokens") if rows else 0.0
    in_tokens = _sum(ok_table, "prompt_tokens") if rows else 0.0
    # Outputs written before schema version 5 have no prefix-cache column: nothing was cached.
    cached = _sum(ok_table, "cached_prompt_tokens") if rows and "cached_prompt_tokens" in table.column_names else 0.0
    device_s = _sum(table, "device_s") if rows else 0.0
    basis_s = wall_s if wall_s else device_s
    drafted = _sum(ok_table, "draft_tokens") if rows else 0.0
    accepted = _sum(ok_table, "accepted_tokens") if rows else 0.0
    ratio = pc.mean(ok_table.column("compression_ratio")).as_py() if ok_table.num_rows else None
    return {
        "documents": docs,
        "rows": rows,
        "ok": rows - failed,
        "failed": failed,
        "failed_fraction": failed / rows if rows else 0.0,
        "tokens_in": int(in_tokens),
        "tokens_in_cached": int(cached),
        "tokens_out": int(out_tokens),
        "mean_compression_ratio": ratio,
        "acceptance_rate": accepted / drafted if drafted else None,
        "wall_s": wall_s,
        "device_s": device_s,
        "throughput_basis": "wall" if wall_s else "device",
        "docs_per_s": docs / basis_s if basis_s else None,
        "output_tokens_per_s": out_tokens / basis_s if basis_s else None,
        "p50_e2e_s": _quantile(ok_table.column("e2e_s"), 0.5) if rows else None,
        "p95_e2e_s": _quantile(ok_table.column("e2e_s"), 0.95) if rows else None,
        "cost_usd": _sum(table, "cost_usd") if rows else 0.0,
        **score_answers(table),
    }


def errors_by_kind(table: pa.Table) -> dict[str, int]:
    """Failed rows per error_kind (a row failed before error_kind existed counts as retryable)."""
    out = dict.fromkeys(ERROR_KINDS, 0)
    if "error_kind" not in table.column_names or not table.num_rows:
        return out
    failed = table.filter(pc.is_valid(table.column("error")))
    for kind in failed.column("error_kind").to_pylist():
        out[kind if kind in out else "retryable"] += 1
    return out


def run_summary(
    figures: pa.Table, wall_s: float | None, date_counts: dict[str, int], aborted: BaseException | None
) -> dict[str, Any]:
    """``summarize`` of this run's rows + status and date-level counts (see module docstring).

    ``date_counts``: stages.partition.DateScan.counts() after the commit.
    """
    s = summarize(figures, wall_s=wall_s)
    rows, failed = date_counts["rows"], date_counts["failed"]
    s["errors_by_kind"] = errors_by_kind(figures)
    s.update(
        date_rows=rows,
        date_failed=failed,
        date_failed_fraction=failed / rows if rows else 0.0,
        date_errors_by_kind={k: date_counts.get(f"errors_{k}", 0) for k in ERROR_KINDS},
        status="failed" if aborted is not None else ("partial" if failed else "succeeded"),
        abort_reason=None if aborted is None else f"{type(aborted).__name__}: {aborted}"[:2000],
    )
    return s


def package_versions() -> dict[str, str | None]:
    """Installed versions of what produced the rows (no imports: torch stays unloaded)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_record_json(summary: dict[str, Any], spec: dict[str, Any]) -> bytes:
    """The run summary file's bytes: {"summary": ..., "spec": ...}."""
    return json.dumps({"summary": summary, "spec": spec}, indent=2, default=str).encode()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    return str(v)


def format_summary(summary: dict[str, Any], title: str = "run summary") -> str:
    keys = [
        ("documents", "documents"),
        ("rows", "rows (requests)"),
        ("ok", "ok"),
        ("failed", "failed"),
        ("retried", "error rows retried"),
        ("status", "status"),
        ("tokens_in", "tokens in (prompt)"),
        ("tokens_in_cached", "  of them from the prefix cache"),
        ("tokens_out", "tokens out"),
        ("mean_compression_ratio", "mean compression ratio"),
        ("acceptance_rate", "draft acceptance rate"),
        ("docs_per_s", f"docs/s ({summary.get('throughput_basis', 'wall')} time)"),
        ("output_tokens_per_s", "output tokens/s"),
        ("p50_e2e_s", "p50 latency (s)"),
        ("p95_e2e_s", "p95 latency (s)"),
        ("wall_s", "wall time (s)"),
        ("cost_usd", "total cost (USD)"),
    ]
    if summary.get("answers_scored"):  # only where the input had references
        keys += [("answers_scored", "answers with a reference"),
                 ("answers_contain", "  containing the reference"),
                 ("answers_exact", "  equal to the reference")]
    width = max(len(label) for _, label in keys)
    lines = [f"== {title} =="]
    lines += [f"  {label.ljust(width)}  {_fmt(summary.get(k))}" for k, label in keys]
    return "\n".join(lines)
