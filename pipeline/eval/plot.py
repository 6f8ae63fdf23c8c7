"""PNG of the eval: accuracy, compression and time per method and budget.

Contract: ``plot_eval(summary, by_depth, path)`` takes ``table.aggregate`` and
``table.breakdown(..., "depth_bin")`` output and writes one PNG with six panels:
exact match, contains, token F1, compression ratio, time per request (mean e2e_s)
as bars grouped by budget (one bar per method), and contains by answer depth (one
line per method and budget). Methods without a budget (none, autocompressor) are
drawn as dashed horizontal lines across the budget groups. When the summary holds
task "nll" rows (pipeline/eval/nll.py) a third row of panels shows continuation NLL,
gap recovered and time per row at the NLL budgets (no-context, none = full context and
autocompressor as dashed lines); an NLL-only summary draws that row alone. Uses the
Agg backend, so it works without a display.

``plot_cost_quality(summary, path)``: cost against quality, one point per qa summary row
(method and budget; equal-reading runs hollow): x = seconds per question (the run's
``wall_s_per_request``, else its mean ``e2e_s``, marked ``*``: a row's latency, not the run's
throughput; log scale), y = ``contains`` (left panel)
and ``evidence_recall`` (right panel; rows without recall are left out). Each point is
labelled with its method and budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

PANELS = (
    ("exact_match", "exact match"),
    ("contains", "contains answer"),
    ("f1", "token F1"),
    ("compression_ratio", "compression ratio (doc / context tokens)"),
    ("e2e_s", "time per request (mean e2e s)"),
)
NLL_PANELS = (
    ("nll", "continuation NLL (nats/token, lower is better)"),
    ("gap_recovered", "NLL gap recovered (no-context -> full)"),
    ("e2e_s", "NLL time per row (s, condition + score)"),
)


def _bars(ax: Any, summary: Sequence[dict[str, Any]], key: str, colors: dict[str, Any]) -> None:
    budgets = sorted({s["target_tokens"] for s in summary if s["target_tokens"] is not None})
    budgeted = [m for m in colors if any(s["method"] == m and s["target_tokens"] for s in summary)]
    width = 0.8 / max(len(budgeted), 1)
    for j, method in enumerate(budgeted):
        vals = {s["target_tokens"]: s[key] for s in summary if s["method"] == method}
        xs = [i + (j - (len(budgeted) - 1) / 2) * width for i in range(len(budgets))]
        # a run that did not happen (or has no figure) draws no bar, not a zero bar
        ys = [float("nan") if vals.get(b) is None else vals[b] for b in budgets]
        ax.bar(xs, ys, width, label=method, color=colors[method])
    for s in summary:
        if s["target_tokens"] is None and s[key] is not None:
            ax.axhline(
                s[key],
                ls="--",
                lw=1.2,
                color=colors[s["method"]],
                label=f"{s['method']} (no budget)",
            )
    ax.set_xticks(range(len(budgets)), [f"{b} tok" for b in budgets])
    ax.set_xlabel("target_tokens")


def _qa_panels(axes: list[Any], qa: Sequence[dict[str, Any]], by_depth: Sequence[dict[str, Any]],
               colors: dict[str, Any]) -> None:  # fmt: skip
    """The six QA panels: PANELS as bars, then contains by answer depth."""
    for ax, (key, label) in zip(axes, PANELS, strict=False):
        _bars(ax, qa, key, colors)
        ax.set_title(label)
        if key in ("exact_match", "contains", "f1"):
            ax.set_ylim(0, 1)
    ax = axes[5]
    series: dict[tuple[str, int | None], dict[str, float]] = {}
    for r in by_depth:
        series.setdefault((r["method"], r["target_tokens"]), {})[r["depth_bin"]] = r["contains"]
    bins = sorted({r["depth_bin"] for r in by_depth})
    styles = ["-", ":", "-.", "--"]
    budgets = sorted({b for _, b in series if b is not None})
    for (method, budget), vals in series.items():
        ls = "--" if budget is None else styles[budgets.index(budget) % len(styles)]
        ax.plot(
            range(len(bins)),
            [vals.get(b) for b in bins],
            ls=ls,
            marker="o",
            color=colors[method],
            label=f"{method} {budget or ''}".strip(),
        )
    ax.set_xticks(range(len(bins)), bins)
    ax.set_ylim(0, 1)
    ax.set_xlabel("answer depth in document")
    ax.set_title("contains answer, by depth")


def plot_eval(
    summary: Sequence[dict[str, Any]],
    by_depth: Sequence[dict[str, Any]],
    path: str | Path,
    title: str = "longdoc eval",
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(s["method"] for s in summary))
    cmap = plt.get_cmap("tab10")
    colors = {m: cmap(i % 10) for i, m in enumerate(methods)}
    nll = [s for s in summary if s.get("task") == "nll"]
    qa = [s for s in summary if s.get("task", "qa") == "qa"]
    with_qa = bool(qa) or not nll  # an NLL-only eval draws only the NLL panels
    rows = (2 if with_qa else 0) + (1 if nll else 0)
    fig, axes = plt.subplots(rows, 3, figsize=(16, 4.5 * rows), squeeze=False)
    if with_qa:
        _qa_panels(list(axes.flat[:6]), qa, by_depth, colors)
    for ax, (key, label) in zip(axes.flat[6 if with_qa else 0 :], NLL_PANELS, strict=False):
        _bars(ax, nll, key, colors)
        ax.set_title(label)
    for a in axes.flat:
        handles, _ = a.get_legend_handles_labels()
        if handles:
            a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _seconds(row: dict[str, Any]) -> float | None:
    """Seconds per question of a summary row: its wall time per request, else mean e2e_s."""
    v = row.get("wall_s_per_request") or row.get("e2e_s")
    return float(v) if v else None


def plot_cost_quality(summary: Sequence[dict[str, Any]], path: str | Path, title: str = "longdoc eval") -> Path:
    """Accuracy and evidence recall against seconds per question (see the module contract)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qa = [s for s in summary if s.get("task", "qa") == "qa" and _seconds(s)]
    methods = list(dict.fromkeys(s["method"] for s in qa))
    cmap = plt.get_cmap("tab10")
    colors = {m: cmap(i % 10) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), squeeze=False)
    panels = (("contains", "accuracy (contains answer)"), ("evidence_recall", "evidence recall (answer sentence kept)"))
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for s in qa:
            if s.get(key) is None:
                continue
            x, y, c = _seconds(s), float(s[key]), colors[s["method"]]
            eq = s.get("equal_to")
            ax.scatter([x], [y], s=60, marker="o", color=c if not eq else "none", edgecolors=c, linewidths=1.5)
            name = f"{s['method']} {s['target_tokens'] or 'full'}" + (f" (={eq})" if eq else "")
            name += "" if s.get("wall_s_per_request") else " *"  # x is its mean e2e_s
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7, color=c)
        ax.set_xscale("log")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("seconds per question (log)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: cost vs quality (hollow: equal reading; *: mean e2e_s per row, "
                 "the run has no wall time, e.g. resumed)")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
