"""Draw one PNG comparing runs: latency, throughput, cost, acceptance and failures.

Contract: ``plot_report(table, path, summaries=None, last=30)`` takes rows with the
output schema (any number of runs and dates) and writes a 3x2 PNG with one x position
per run (``run_date`` + ``run_id``, in date order), showing at most the ``last`` runs
(the title says how many were left out). The figure has a fixed size, so it stays
readable for 1 run and for 60: legends sit above the axes (never over the bars),
x labels are thinned to about ``MAX_LABELS`` and rotated, and a lone run is a narrow
bar, not a slab. Aggregates come from ``pipeline.report.summary.summarize`` so the plot
and ``longdoc report`` never disagree; pass ``summaries`` (from
``pipeline.report.load.run_summaries``) to plot throughput over the recorded wall time
instead of the device-time fallback. The failure panel shows each run's failed fraction,
stacked by ``error_kind`` when the table has that column (failed/rows written on the
bars while labels fit). Uses the Agg backend: no display needed.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.summary import summarize

DEFAULT_LAST = 30
MAX_LABELS = 16  # x tick labels beyond this overlap at the figure's width


def per_run_summaries(table: pa.Table) -> list[dict[str, Any]]:
    """One summary per (run_date, run_id), sorted by date then id."""
    keys = table.select(["run_date", "run_id"]).group_by(["run_date", "run_id"]).aggregate([])
    out = []
    for rec in sorted(keys.to_pylist(), key=lambda r: (r["run_date"] or "", r["run_id"] or "")):
        out.append({**rec, **summarize(table.filter(_run_mask(table, rec)))})
    return out


def _run_mask(table: pa.Table, rec: dict[str, Any]) -> pa.ChunkedArray:
    return pc.and_(pc.equal(table["run_date"], rec["run_date"]), pc.equal(table["run_id"], rec["run_id"]))


def failures_by_kind(table: pa.Table, runs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Failed rows per run, keyed by ``error_kind`` ("error" when the column is absent)."""
    has_kind = "error_kind" in table.column_names
    out: dict[str, list[int]] = {}
    for i, rec in enumerate(runs):
        failed = table.filter(pc.and_(_run_mask(table, rec), pc.is_valid(table["error"])))
        kinds = failed.column("error_kind").to_pylist() if has_kind else ["error"] * failed.num_rows
        for k in kinds:
            out.setdefault(k or "unclassified", [0] * len(runs))[i] += 1
    return dict(sorted(out.items()))


def _val(s: dict[str, Any], key: str) -> float:
    v = s.get(key)
    return float("nan") if v is None else float(v)


def _label(s: dict[str, Any], dates_unique: bool) -> str:
    rid = str(s["run_id"])
    return str(s["run_date"]) if dates_unique else f"{s['run_date']}\n…{rid[-8:]}"


def _legend_above(ax: Any, ncol: int) -> None:
    """Legend right-aligned above the axes, on the title's line: never over the data."""
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=ncol, frameon=False,
              fontsize=8, borderaxespad=0.2, handlelength=1.2, columnspacing=1.0)


def plot_report(
    table: pa.Table,
    path: str,
    summaries: list[dict[str, Any]] | None = None,
    last: int = DEFAULT_LAST,
) -> list[dict[str, Any]]:
    """Write the per-run report PNG to ``path`` (local path); return the runs drawn.

    ValueError if there are no rows or ``last`` < 1.
    """
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    if table.num_rows == 0:
        raise ValueError("plot_report: the table has no rows to plot")
    if last < 1:
        raise ValueError(f"plot_report: last={last}; allowed: a number of runs >= 1")
    all_runs = summaries if summaries is not None else per_run_summaries(table)
    runs = all_runs[-last:]
    n = len(runs)
    x = list(range(n))
    dates_unique = len({s["run_date"] for s in runs}) == n
    labels = [_label(s, dates_unique) for s in runs]
    w = 0.8 if n > 1 else 0.35  # one run: a narrow bar in the middle, not a slab

    fig, axes = plt.subplots(3, 2, figsize=(13, 11), squeeze=False, sharex=True)
    (lat, tok), (docs, cost), (acc, fail) = axes

    half = w / 2
    lat.bar([i - half / 2 for i in x], [_val(s, "p50_e2e_s") for s in runs], half, label="p50")
    lat.bar([i + half / 2 for i in x], [_val(s, "p95_e2e_s") for s in runs], half, label="p95")
    lat.set_title("End-to-end latency per request", loc="left")
    lat.set_ylabel("e2e_s (seconds)")
    _legend_above(lat, 2)

    basis = "/".join(sorted({s.get("throughput_basis", "device") for s in runs}))
    tok.bar(x, [_val(s, "output_tokens_per_s") for s in runs], w, color="tab:purple")
    tok.set_title(f"Output tokens / s ({basis} time)", loc="left")
    tok.set_ylabel("tokens / s")
    docs.bar(x, [_val(s, "docs_per_s") for s in runs], w, color="tab:green")
    docs.set_title(f"Documents / s ({basis} time)", loc="left")
    docs.set_ylabel("documents / s")

    cost.bar(x, [_val(s, "cost_usd") for s in runs], w, color="tab:red")
    cost.set_title("Cost per run", loc="left")
    cost.set_ylabel("USD (sum of cost_usd)")

    rates = [_val(s, "acceptance_rate") for s in runs]
    acc.bar(x, [0.0 if math.isnan(r) else r for r in rates], w, color="tab:orange")
    na = [i for i, r in enumerate(rates) if math.isnan(r)]
    if na and n <= MAX_LABELS:  # nothing drafted (speculation off): say so, not a 0 bar
        for i in na:
            acc.text(i, 0.02, "n/a", ha="center", va="bottom", fontsize=8)
    elif na:
        acc.plot(na, [0.01] * len(na), "x", color="0.4", label="nothing drafted")
        _legend_above(acc, 1)
    acc.set_title("Draft acceptance rate", loc="left")
    acc.set(ylabel="accepted / drafted", ylim=(0, 1.05))

    _failure_panel(fail, table, runs, x, w)

    step = max(1, math.ceil(n / MAX_LABELS))
    ticks = x[::-1][::step][::-1]  # always label the newest run
    for ax in axes.flat:
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlim(-0.6 if n > 1 else -1.0, n - 0.4 if n > 1 else 1.0)
    for ax in axes[-1]:
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[i] for i in ticks], fontsize=7, rotation=45 if n > 4 else 0,
                           ha="right" if n > 4 else "center")
        ax.set_xlabel("run (date" + ("" if dates_unique else ", run id tail") + ")")
    shown = f"last {n} of {len(all_runs)} runs" if n < len(all_runs) else f"{n} run(s)"
    rows = sum(int(s["rows"]) for s in runs)
    fig.suptitle(f"longdoc runs: {shown}, {rows} rows", fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return runs


def _failure_panel(ax: Any, table: pa.Table, runs: list[dict[str, Any]], x: list[int], w: float) -> None:
    """Failed fraction of each run's rows, stacked by error kind; "failed/rows" on top when it fits."""
    from matplotlib.ticker import PercentFormatter

    kinds = failures_by_kind(table, runs)
    rows = [max(int(s["rows"]), 1) for s in runs]
    bottom = [0.0] * len(runs)
    colors = ["tab:red", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
    for j, (kind, counts) in enumerate(kinds.items()):
        frac = [c / r for c, r in zip(counts, rows)]
        ax.bar(x, frac, w, bottom=bottom, color=colors[j % len(colors)], label=kind)
        bottom = [b + f for b, f in zip(bottom, frac)]
    if kinds:
        _legend_above(ax, min(len(kinds), 3))
    top = max(bottom) if any(bottom) else 0.0
    ax.set_ylim(0, max(top * 1.2, 0.05))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    if len(runs) <= MAX_LABELS:  # counts above each bar while they fit
        for i, s in enumerate(runs):
            ax.text(i, bottom[i], f"{int(s['failed'])}/{int(s['rows'])}", ha="center", va="bottom", fontsize=7)
    if not kinds:
        ax.text(0.5, 0.5, "no failed rows", transform=ax.transAxes, ha="center", va="center", color="0.4")
    worst = max(runs, key=lambda s: _val(s, "failed_fraction"))
    total_failed = sum(int(s["failed"]) for s in runs)
    ax.set_title(f"Failed rows: {total_failed} (worst run {_val(worst, 'failed_fraction'):.0%})", loc="left")
    ax.set_ylabel("failed / rows of the run")
