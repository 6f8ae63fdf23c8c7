"""Run summaries: one definition of every aggregate, for `longdoc run` and `report`.

Contract: ``summarize(table, wall_s)`` takes any table with the output schema's
figure columns (text columns optional) and returns a flat dict; throughput figures
use ``wall_s`` when the run's wall time is known, else the summed device seconds
(stated in ``throughput_basis``). ``format_summary`` renders it as an aligned table.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def _quantile(col: pa.ChunkedArray, q: float) -> float | None:
    vals = pc.drop_null(col)
    if len(vals) == 0:
        return None
    return float(pc.quantile(vals, q=q, interpolation="linear")[0].as_py())


def _sum(table: pa.Table, col: str) -> float:
    v = pc.sum(table.column(col)).as_py()
    return float(v or 0)


def summarize(table: pa.Table, wall_s: float | None = None) -> dict[str, Any]:
    rows = table.num_rows
    errors = table.column("error")
    failed = rows - int(pc.sum(pc.is_null(errors)).as_py() or 0) if rows else 0
    ok_table = table.filter(pc.is_null(errors)) if rows else table
    docs = len(pc.unique(table.column("doc_id"))) if rows else 0
    out_tokens = _sum(ok_table, "output_tokens") if rows else 0.0
    in_tokens = _sum(ok_table, "prompt_tokens") if rows else 0.0
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
    }


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
        ("tokens_in", "tokens in (prompt)"),
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
    width = max(len(label) for _, label in keys)
    lines = [f"== {title} =="]
    lines += [f"  {label.ljust(width)}  {_fmt(summary.get(k))}" for k, label in keys]
    return "\n".join(lines)
