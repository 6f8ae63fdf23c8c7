"""Draw one PNG comparing runs: latency, throughput, cost and speculation acceptance.

Contract: ``plot_report(table, path)`` takes rows with the output schema (any number of
runs and dates) and writes a 2x2 PNG with one x position per run (``run_date`` +
``run_id``, in date order). Aggregates come from ``pipeline.report.summary.summarize`` so the
plot and ``longdoc report`` never disagree; pass ``summaries`` (from
``pipeline.report.run_summaries``) to plot throughput over the recorded wall time
instead of the device-time fallback. Uses the Agg backend: no display needed.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.summary import summarize


def per_run_summaries(table: pa.Table) -> list[dict[str, Any]]:
    """One summary per (run_date, run_id), sorted by date then id."""
    keys = table.select(["run_date", "run_id"]).group_by(["run_date", "run_id"]).aggregate([])
    out = []
    for rec in sorted(keys.to_pylist(), key=lambda r: (r["run_date"] or "", r["run_id"] or "")):
        mask = pc.and_(pc.equal(table["run_date"], rec["run_date"]),
                       pc.equal(table["run_id"], rec["run_id"]))
        out.append({**rec, **summarize(table.filter(mask))})
    return out


def _val(s: dict[str, Any], key: str) -> float:
    v = s.get(key)
    return float("nan") if v is None else float(v)


def plot_report(table: pa.Table, path: str, summaries: list[dict[str, Any]] | None = None) -> None:
    """Write the per-run report PNG to ``path`` (local path). ValueError if there are no rows."""
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    if table.num_rows == 0:
        raise ValueError("plot_report: the table has no rows to plot")
    runs = summaries if summaries is not None else per_run_summaries(table)
    labels = [f"{s['run_date']}\n{s['run_id']}" for s in runs]
    x = list(range(len(runs)))
    w = 0.38

    fig, axes = plt.subplots(2, 2, figsize=(max(9.0, 1.6 * len(runs) + 4), 7.5), squeeze=False)
    (lat, thr), (cost, acc) = axes

    lat.bar([i - w / 2 for i in x], [_val(s, "p50_e2e_s") for s in runs], w, label="p50")
    lat.bar([i + w / 2 for i in x], [_val(s, "p95_e2e_s") for s in runs], w, label="p95")
    lat.set(title="End-to-end latency per request", ylabel="e2e_s (seconds)")
    lat.legend()

    basis = {s.get("throughput_basis", "device") for s in runs}
    thr.bar([i - w / 2 for i in x], [_val(s, "docs_per_s") for s in runs], w, color="tab:green",
            label="docs/s")
    thr.set(title=f"Throughput ({'/'.join(sorted(basis))} time)", ylabel="documents / s")
    tok = thr.twinx()  # tokens/s is ~100x docs/s: its own axis keeps both readable
    tok.bar([i + w / 2 for i in x], [_val(s, "output_tokens_per_s") for s in runs], w,
            color="tab:purple", label="output tokens/s")
    tok.set_ylabel("output tokens / s")
    for ax in (thr, tok):  # headroom above the bars for the legend
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    handles = thr.get_legend_handles_labels()[0] + tok.get_legend_handles_labels()[0]
    thr.legend(handles, ["docs/s", "output tokens/s"], loc="upper left")

    cost.bar(x, [_val(s, "cost_usd") for s in runs], 0.6, color="tab:red")
    cost.set(title="Cost per run", ylabel="USD (sum of cost_usd)")

    rates = [_val(s, "acceptance_rate") for s in runs]
    acc.bar(x, [0.0 if math.isnan(r) else r for r in rates], 0.6, color="tab:orange")
    for i, r in enumerate(rates):
        if math.isnan(r):  # nothing drafted (speculation off): say so instead of a 0 bar
            acc.text(i, 0.02, "n/a", ha="center", va="bottom")
    acc.set(title="Draft acceptance rate", ylabel="accepted / drafted", ylim=(0, 1.05))

    for ax in (lat, thr, cost, acc):
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"longdoc runs: {table.num_rows} rows, {len(runs)} run(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
