"""Score output rows against references and aggregate them per method and budget.

Contract:
- ``score_rows(method, target_tokens, rows, meta, evidence)`` turns the pipeline's output rows
  (schemas/output.py columns) of one run into scored rows: the run's method and
  budget, the question's ``kind``, ``style`` and ``depth`` from the eval set, every metric
  of pipeline.eval.metrics, and the reader-independent evidence recall of
  pipeline.eval.recall (``RECALL_COLUMNS``, from the row's ``kept_spans`` and ``evidence``;
  None without them). Error rows score 0 (a failure is a wrong answer) and
  keep their ``error``; their recall is None.
- ``aggregate(scored)`` -> one summary dict per (method, target_tokens), task "qa", in
  ``METHOD_ORDER`` then budget order. Accuracy figures average over all rows; recall
  over the rows that have it (``recall_n`` of them); cost figures over the successful
  rows only, since failed rows have none: means of context_tokens (the tokens the
  reader sees), compress_s and e2e_s, and ``compression_ratio`` as the aggregate
  sum(doc_tokens) / sum(context_tokens) (``aggregate_ratio``: in a mean of per-row
  ratios a row keeping a handful of tokens outweighs all the others). ``equal_to``
  names, for an equal-reading run, the run whose mean reading set its budget
  (``"finch@512"``; pipeline/eval/runner.py).
- ``breakdown(scored, key)`` -> accuracy per (method, budget, key value), for
  ``kind``, ``style`` or ``depth_bin``.
- ``per_style(scored, metric)`` -> one row per (method, budget): ``metric`` per question
  style (pipeline.corpus.styles; the styles present, in STYLE_ORDER) and over all
  questions, each style's count of distinct questions in its column name
  (``echoed (n=38)``): every method read per style side by side.
``target_tokens`` is None for methods that take no budget (none, autocompressor).
The summary table (``SUMMARY_COLUMNS``) also holds the ``task`` "nll" rows of
pipeline.eval.nll.aggregate_nll (its ``nll``/``gap_recovered`` columns; QA metrics blank).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline.eval.metrics import METRICS, score
from pipeline.eval.recall import RECALL_COLUMNS, EvidenceIndex, recall_figures
from schemas.output import compression_ratio, reference_alternatives
from stages.compression import method_names

METHOD_ORDER = method_names()  # the registry's display order (stages/compression/)
COST_COLUMNS = ("compression_ratio", "context_tokens", "compress_s", "device_s", "e2e_s")
NLL_COLUMNS = ("nll", "gap_recovered")  # pipeline/eval/nll.py (task "nll" rows)
SUMMARY_COLUMNS = (
    "task",
    "method",
    "target_tokens",
    "equal_to",
    "n",
    "failed",
    *METRICS,
    "evidence_recall",
    "answer_recall",
    "recall_n",
    *NLL_COLUMNS,
    *COST_COLUMNS,
    "wall_s_per_request",
)
#: One line per summary column, printed under the table (``legend``): a reader of the
#: table should not need the source to know which figure to read.
COLUMN_LEGEND = {
    "equal_to": "the run whose mean tokens read set this run's budget (--equal-reading)",
    "n": "questions", "failed": "rows with an error (scored as wrong)",
    "exact_match": "answer equal to a reference after normalizing (rare for a chatty model)",
    "contains": "answer containing a reference after normalizing: the accuracy to read",
    "f1": "token F1 of the answer against the best reference",
    "evidence_recall": "questions whose answer-bearing sentence the method kept whole (needs no reader)",
    "answer_recall": "questions whose answer tokens the method kept",
    "recall_n": "questions with a known evidence position (the recall's denominator)",
    "nll": "continuation NLL per token, nats (--metrics nll)",
    "gap_recovered": "share of the no-context -> full-context NLL gap the method recovers",
    "compression_ratio": "document tokens / tokens the model read, each summed over the questions (not a mean of their ratios)",
    "context_tokens": "tokens the model read (mean)", "compress_s": "compression seconds per question (mean)",
    "device_s": "the generator's device seconds per question (mean; a text method's compress_s is on top): "
                "what a question costs at a price per device hour",
    "e2e_s": "seconds per question from its submission to its answer (mean; a run submits all its questions "
             "at once, so this holds the wait in the queue: a latency, not a cost)",
    "wall_s_per_request": "the run's wall time divided by its questions (the throughput figure; runs of one "
                          "eval compare, runs of separate evals on a shared machine need not)",
}


def legend(columns: Sequence[str]) -> str:
    """The ``COLUMN_LEGEND`` lines of ``columns`` (Markdown list)."""
    return "\n".join(f"- `{c}`: {COLUMN_LEGEND[c]}" for c in columns if c in COLUMN_LEGEND)


DEPTH_BINS = 5

QuestionMeta = dict[tuple[str, str], dict[str, Any]]  # (doc_id, question) -> {kind, style, depth}
STYLE_ORDER = ("echoed", "paraphrased", "two_sentence")  # pipeline.corpus.styles.STYLES


def depth_bin(depth: float | None) -> str | None:
    """'0.0-0.2' style label of the answer's relative depth (DEPTH_BINS equal bins)."""
    if depth is None or (isinstance(depth, float) and math.isnan(depth)):
        return None
    i = min(int(float(depth) * DEPTH_BINS), DEPTH_BINS - 1)
    return f"{i / DEPTH_BINS:.1f}-{(i + 1) / DEPTH_BINS:.1f}"


def score_rows(
    method: str, target_tokens: int | None, rows: Iterable[dict[str, Any]], meta: QuestionMeta,
    evidence: EvidenceIndex | None = None,
) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        question = r.get("prompt")
        info = meta.get((str(r.get("doc_id")), str(question)), {})
        ref = r.get("reference")
        ok = r.get("error") is None
        pred = r.get("output_text") if ok else None
        metrics = score(pred, reference_alternatives(ref)) if ref is not None else dict.fromkeys(METRICS)
        out.append(
            {
                "method": method,
                "target_tokens": target_tokens,
                "doc_id": r.get("doc_id"),
                "question": question,
                "reference": ref,
                "output_text": r.get("output_text"),
                "kind": info.get("kind"),
                "style": info.get("style"),
                "depth": info.get("depth"),
                "depth_bin": depth_bin(info.get("depth")),
                **metrics,
                **recall_figures(
                    r.get("kept_spans") if ok else None,
                    (evidence or {}).get((str(r.get("doc_id")), str(question))),
                    r.get("doc_tokens"),
                ),
                "doc_tokens": r.get("doc_tokens"),
                **{c: r.get(c) for c in COST_COLUMNS},
                "error": r.get("error"),
            }
        )
    return out


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def aggregate_ratio(rows: Iterable[dict[str, Any]]) -> float | None:
    """sum(doc_tokens) / sum(context_tokens) over ``rows`` that have both (None without any,
    or when they read nothing): the compression ratio of a set of rows."""
    sized = [r for r in rows if r.get("doc_tokens") is not None and r.get("context_tokens") is not None]
    return compression_ratio(sum(int(r["doc_tokens"]) for r in sized), sum(int(r["context_tokens"]) for r in sized))


def _sort_key(key: tuple[str, int | None]) -> tuple[int, int]:
    method, budget = key
    rank = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)
    return rank, -1 if budget is None else budget


def _groups(scored: Sequence[dict[str, Any]], extra: str | None = None) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in scored:
        key = (r["method"], r["target_tokens"]) + ((r.get(extra),) if extra else ())
        groups.setdefault(key, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (_sort_key(kv[0][:2]), str(kv[0][2:]))))


def aggregate(
    scored: Sequence[dict[str, Any]], wall_s: dict[tuple[str, int | None], float] | None = None,
    equal_to: dict[tuple[str, int | None], str] | None = None,
) -> list[dict[str, Any]]:
    """Summary per (method, budget); ``wall_s`` maps a run to its pipeline wall time,
    ``equal_to`` an equal-reading run to the run it reads as much as."""
    out = []
    for (method, budget), rows in _groups(scored).items():
        ok = [r for r in rows if r["error"] is None]
        wall = (wall_s or {}).get((method, budget))
        summary: dict[str, Any] = {"task": "qa", "method": method, "target_tokens": budget}
        summary["equal_to"] = (equal_to or {}).get((method, budget))
        summary["n"] = len(rows)
        summary["failed"] = len(rows) - len(ok)
        summary.update({m: _mean(r[m] for r in rows) for m in METRICS})
        summary.update({c: _mean(r.get(c) for r in rows) for c in RECALL_COLUMNS})
        summary["recall_n"] = sum(r.get("evidence_recall") is not None for r in rows)
        summary.update({c: aggregate_ratio(ok) if c == "compression_ratio" else _mean(r[c] for r in ok)
                        for c in COST_COLUMNS})
        summary["wall_s_per_request"] = wall / len(rows) if wall and rows else None
        out.append(summary)
    return out


def breakdown(scored: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Accuracy per (method, budget, value of ``key``); rows without a value are left out."""
    out = []
    for (method, budget, value), rows in _groups(scored, key).items():
        if value is None:
            continue
        entry = {"method": method, "target_tokens": budget, key: value, "n": len(rows)}
        entry.update({m: _mean(r[m] for r in rows) for m in METRICS})
        entry.update({c: _mean(r.get(c) for r in rows) for c in RECALL_COLUMNS})
        out.append(entry)
    return out


def per_style(scored: Sequence[dict[str, Any]], metric: str = "contains") -> list[dict[str, Any]]:
    """``metric`` per (method, budget) and question style, plus ``all`` (see the contract).

    A column's count is the distinct questions of that style in ``scored``, so every row
    has the same columns; a run without a question of a style shows None there."""
    questions: dict[str, set[tuple[Any, Any]]] = {}
    for r in scored:
        if r.get("style") is not None:
            questions.setdefault(r["style"], set()).add((r.get("doc_id"), r.get("question")))
    styles = [s for s in STYLE_ORDER if s in questions] + sorted(set(questions) - set(STYLE_ORDER))
    if not styles:
        return []
    every = {(r.get("doc_id"), r.get("question")) for r in scored}
    out = []
    for (method, budget), rows in _groups(scored).items():
        entry: dict[str, Any] = {"method": method, "target_tokens": budget}
        for s in styles:
            entry[f"{s} (n={len(questions[s])})"] = _mean(r.get(metric) for r in rows if r.get("style") == s)
        entry[f"all (n={len(every)})"] = _mean(r.get(metric) for r in rows)
        out.append(entry)
    return out


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def to_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured markdown table; None prints as '-' (e.g. no budget)."""
    cols = list(columns or (rows[0].keys() if rows else ()))
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(
    rows: Sequence[dict[str, Any]], path: Path, columns: Sequence[str] | None = None
) -> None:
    cols = list(columns or (rows[0].keys() if rows else ()))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
