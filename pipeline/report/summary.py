"""Run summaries: one definition of every aggregate, for `longdoc run` and `report`.

Contract: ``RunTally`` folds the rows block by block into the run's aggregates (what
`longdoc run`'s driver keeps: a float and an int per row, not the rows);
``summarize(table, wall_s)`` takes any table with the output schema's
figure columns (text columns optional) and returns a flat dict (``cut_off`` and
``cut_repeat``: the ok rows whose generation stopped at ``max_new_tokens`` or at the repeat
guard, their text possibly cut; None where no row says why it stopped: rows written before
the ``finish_reason`` column); throughput figures
use ``wall_s`` when the run's wall time is known, else the summed device seconds
(stated in ``throughput_basis``). ``format_summary`` renders it as an aligned table.

Where the time went (every row, failed ones too; seconds summed over rows): the device
time (``device_s``) splits into ``time_method_read_s`` (the reading of a method that
compresses inside the engine's prefill, e.g. finch, select, autocompressor: their rows'
``compress_s``), ``time_prompt_prefill_s`` (the rest of ``prefill_s``: the prompts the
generator prefilled) and ``time_decode_s`` (``device_s - prefill_s``: each row's share of
the decode steps); ``time_text_compress_s`` is the compression done before the engine
(e.g. rag, bm25, truncate: not device time of the generator, but charged in ``cost_usd``, so
``cost_usd`` = (``device_s`` + ``time_text_compress_s``) x the price / 3600);
``time_stall_s`` sums what decoding rows waited for other rows' prefill (wall time of rows,
which overlap).

``compression_ratio`` is the run's aggregate ratio, sum(doc_tokens) / sum(context_tokens)
over the ok rows that have both (what the run read of what it was given), not the mean of
the rows' ratios: a row keeping a handful of tokens would dominate that mean.

``run_summary`` adds what `longdoc run` records for one run: ``status``
(``succeeded``: the date has no error row; ``partial``: the run completed but some rows
of the date failed; ``failed``: Ray aborted the run, its unfinished requests are
retryable error rows; ``abort_reason`` its one-line cause, ``abort_traceback`` its stack), ``errors_by_kind`` (this run's rows) and the date as a whole
(``date_rows``, ``date_failed``, ``date_failed_fraction``, ``date_errors_by_kind``: each
request once, after retried rows replaced old ones). ``run_record_json`` is the bytes
of the run record (``{output}.runs/{date}/{run_id}.json``, stages/layout.py
``run_record_path``); ``package_versions`` the versions it carries.
"""

from __future__ import annotations

import functools
import json
import platform
import traceback
from importlib import metadata
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.output import ERROR_KINDS, compression_ratio, error_cause, reference_alternatives

ABORT_TRACEBACK_CHARS = 8000  # a run record stays small; the innermost frames are kept
VERSIONED_PACKAGES = ("longdoc", "torch", "transformers", "ray", "pyarrow", "fsspec")


def _sum(table: pa.Table, col: str) -> float:
    v = pc.sum(table.column(col)).as_py()
    return float(v or 0)


@functools.cache
def _engine_methods() -> pa.Array:
    """Names of the compression methods that read inside the engine's prefill (module docstring)."""
    from stages.compression import registry

    return pa.array([name for name, m in registry().items() if m.runs_at == "prefill"], pa.string())


def contains_reference(reference: str, answer: str | None) -> bool:
    """Whether ``answer`` contains one of ``reference``'s acceptable answers
    (schemas/output.py ``reference_alternatives``) as whole words, after normalizing both by
    the eval's rules (pipeline/eval/metrics.py; a failed row's answer is None: it contains
    nothing)."""
    from pipeline.eval.metrics import contains

    return contains(answer, reference_alternatives(reference)) > 0


def equals_reference(reference: str, answer: str | None) -> bool:
    """Whether ``answer`` equals one of ``reference``'s acceptable answers after normalizing."""
    from pipeline.eval.metrics import exact_match

    return exact_match(answer, reference_alternatives(reference)) > 0


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
    return {
        "answers_scored": len(pairs),
        "answers_contain": sum(contains_reference(r, o) for r, o in pairs) / len(pairs),
        "answers_exact": sum(equals_reference(r, o) for r, o in pairs) / len(pairs),
    }


class RunTally:
    """The run's aggregates, folded block by block: what the driver keeps instead of the
    rows. Memory per row: one float (its end-to-end latency, for the quantiles) and one
    int (its document's hash, for the document count); every other figure is a running
    sum. ``summary(wall_s)`` equals ``summarize`` of the blocks concatenated (tested)."""

    _SUMS_OK = ("output_tokens", "prompt_tokens", "cached_prompt_tokens", "draft_tokens", "accepted_tokens",
                "decode_steps")
    _SUMS_ALL = ("device_s", "cost_usd")

    def __init__(self) -> None:
        self.rows = self.failed = 0
        # ok rows with a decode_steps figure (rows written before it have none; rows the repeat
        # guard cut are left out), their tokens and their steps
        self.stepped, self.stepped_tokens, self.stepped_steps = 0, 0.0, 0.0
        # ok rows that stopped at max_new_tokens / at the repeat guard; None while no row says
        # why it stopped (rows written before the finish_reason column)
        self.cut: dict[str, int] | None = None
        # ok rows' document tokens and tokens kept, summed over rows that have both: their
        # quotient is the run's compression ratio (module docstring)
        self.doc_tokens = self.context_tokens = 0
        self.sums = dict.fromkeys(self._SUMS_OK + self._SUMS_ALL, 0.0)
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.times = dict.fromkeys(("method_read_s", "text_compress_s", "prefill_s", "stall_s"), 0.0)
        self._e2e: list[np.ndarray] = []  # ok rows' e2e_s, one array per block
        self._docs: list[np.ndarray] = []  # hash(doc_id) per row, folded to unique values

    def add(self, table: pa.Table) -> RunTally:
        """Fold one block (any table with the output schema's figure columns)."""
        if not table.num_rows:
            return self
        errors = table.column("error")
        ok = pc.is_null(errors)
        n_failed = table.num_rows - int(pc.sum(ok).as_py() or 0)
        self.rows += table.num_rows
        self.failed += n_failed
        ok_table = table.filter(ok)
        for name in self._SUMS_OK:  # old outputs may lack a column: nothing to add
            if name in table.column_names:
                self.sums[name] += _sum(ok_table, name)
        if "decode_steps" in table.column_names:
            stepped = ok_table.filter(pc.is_valid(ok_table.column("decode_steps")))
            if "finish_reason" in table.column_names:
                # A row the repeat guard cut keeps fewer tokens than its steps made (the loop is
                # dropped, its passes are counted): with it the figure fell below 1 (0.79 on a
                # run of summaries all cut so), as if speculation had cost passes.
                cut = pc.fill_null(pc.equal(stepped.column("finish_reason"), "repeat"), False)
                stepped = stepped.filter(pc.invert(cut))
            self.stepped += stepped.num_rows
            self.stepped_tokens += _sum(stepped, "output_tokens")
            self.stepped_steps += _sum(stepped, "decode_steps")
        for name in self._SUMS_ALL:
            self.sums[name] += _sum(table, name)
        self._add_times(table)
        reasons = ok_table.column("finish_reason") if "finish_reason" in table.column_names else None
        if reasons is not None and reasons.null_count < len(reasons):
            counts = {v["values"]: v["counts"] for v in pc.value_counts(reasons).to_pylist()}
            self.cut = self.cut or {"length": 0, "repeat": 0}
            for reason in self.cut:
                self.cut[reason] += int(counts.get(reason, 0))
        sized = ok_table.filter(pc.and_(pc.is_valid(ok_table.column("doc_tokens")),
                                        pc.is_valid(ok_table.column("context_tokens"))))
        self.doc_tokens += int(_sum(sized, "doc_tokens"))
        self.context_tokens += int(_sum(sized, "context_tokens"))
        self._e2e.append(pc.drop_null(ok_table.column("e2e_s")).to_numpy(zero_copy_only=False).astype(np.float64))
        # A document's rows may span blocks: unique hashes, re-folded as they accumulate.
        self._docs.append(np.unique(np.fromiter((hash(d) for d in table.column("doc_id").to_pylist()),
                                                dtype=np.int64, count=table.num_rows)))
        if len(self._docs) >= 64:
            self._docs = [np.unique(np.concatenate(self._docs))]
        if n_failed and "error_kind" in table.column_names:
            for kind in table.filter(pc.invert(ok)).column("error_kind").to_pylist():
                self.errors[kind if kind in self.errors else "retryable"] += 1
        elif n_failed:  # a row failed before error_kind existed counts as retryable
            self.errors["retryable"] += n_failed
        return self

    def _add_times(self, table: pa.Table) -> None:
        """Fold the block's time columns (module docstring); old outputs may lack them."""
        names = table.column_names
        if "compress_s" in names and "compression" in names:
            in_engine = pc.fill_null(pc.is_in(table.column("compression"), value_set=_engine_methods()), False)
            spent = pc.fill_null(table.column("compress_s"), 0.0)
            self.times["method_read_s"] += float(pc.sum(pc.if_else(in_engine, spent, 0.0)).as_py() or 0.0)
            self.times["text_compress_s"] += float(pc.sum(pc.if_else(in_engine, 0.0, spent)).as_py() or 0.0)
        for name in ("prefill_s", "stall_s"):
            if name in names:
                self.times[name] += _sum(table, name)

    @property
    def documents(self) -> int:
        return len(np.unique(np.concatenate(self._docs))) if self._docs else 0

    def summary(self, wall_s: float | None = None) -> dict[str, Any]:
        """The flat summary dict (module docstring), without answer scores (no text kept)."""
        rows, failed, s = self.rows, self.failed, self.sums
        docs = self.documents
        basis_s = wall_s if wall_s else s["device_s"]
        e2e = np.concatenate(self._e2e) if self._e2e else np.zeros(0)
        quantile = (lambda q: float(np.quantile(e2e, q))) if len(e2e) else (lambda q: None)
        return {
            "documents": docs,
            "rows": rows,
            "ok": rows - failed,
            "failed": failed,
            "cut_off": None if self.cut is None else self.cut["length"],
            "cut_repeat": None if self.cut is None else self.cut["repeat"],
            "failed_fraction": failed / rows if rows else 0.0,
            "tokens_in": int(s["prompt_tokens"]),
            "tokens_in_cached": int(s["cached_prompt_tokens"]),
            "tokens_out": int(s["output_tokens"]),
            "compression_ratio": compression_ratio(self.doc_tokens, self.context_tokens),
            "acceptance_rate": s["accepted_tokens"] / s["draft_tokens"] if s["draft_tokens"] else None,
            "draft_tokens": int(s["draft_tokens"]),
            # Tokens per target forward pass (the row's prefill pass included): what speculation
            # saved, in a figure that does not depend on the machine's load (wall time does).
            "tokens_per_step": self.stepped_tokens / (self.stepped_steps + self.stepped) if self.stepped else None,
            "wall_s": wall_s,
            "device_s": s["device_s"],
            "throughput_basis": "wall" if wall_s else "device",
            "docs_per_s": docs / basis_s if basis_s else None,
            "output_tokens_per_s": s["output_tokens"] / basis_s if basis_s else None,
            "p50_e2e_s": quantile(0.5),
            "p95_e2e_s": quantile(0.95),
            "cost_usd": s["cost_usd"],
            "time_text_compress_s": self.times["text_compress_s"],
            "time_method_read_s": self.times["method_read_s"],
            "time_prompt_prefill_s": max(0.0, self.times["prefill_s"] - self.times["method_read_s"]),
            "time_decode_s": max(0.0, s["device_s"] - self.times["prefill_s"]),
            "time_stall_s": self.times["stall_s"],
        }


def summarize(table: pa.Table, wall_s: float | None = None) -> dict[str, Any]:
    """The summary of one table of rows (``RunTally`` of it, plus answer scores when the
    table has its text columns)."""
    return {**RunTally().add(table).summary(wall_s), **score_answers(table)}


def run_summary(
    tally: RunTally, wall_s: float | None, date_counts: dict[str, int], aborted: BaseException | None
) -> dict[str, Any]:
    """The summary of this run's rows (``tally``) + status and date-level counts (see module
    docstring).

    ``date_counts``: stages.partition.DateScan.counts() after the commit.
    """
    s = tally.summary(wall_s)
    rows, failed = date_counts["rows"], date_counts["failed"]
    s["errors_by_kind"] = dict(tally.errors)
    s.update(
        date_rows=rows,
        date_failed=failed,
        date_failed_fraction=failed / rows if rows else 0.0,
        date_errors_by_kind={k: date_counts.get(f"errors_{k}", 0) for k in ERROR_KINDS},
        status="failed" if aborted is not None else ("partial" if failed else "succeeded"),
        abort_reason=None if aborted is None else error_cause(aborted, 2000),
        # Where the abort came from: a bug in the driver's own code is caught like Ray giving
        # up (nothing lost: every unwritten request becomes a retryable error row), so its
        # stack is kept here rather than hidden behind the one-line reason.
        abort_traceback=None if aborted is None else abort_traceback(aborted),
    )
    return s


def abort_traceback(err: BaseException, limit: int = ABORT_TRACEBACK_CHARS) -> str:
    """The formatted traceback of ``err`` (with its causes), its last ``limit`` characters."""
    text = "".join(traceback.format_exception(err))
    return text if len(text) <= limit else "..." + text[-limit:]


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
        ("cut_off", "  of them cut at max_new_tokens"),
        ("cut_repeat", "  of them cut by the repeat guard"),
        ("failed", "failed"),
        ("retried", "error rows retried"),
        ("status", "status"),
        ("tokens_in", "tokens in (prompt)"),
        ("tokens_in_cached", "  of them from the prefix cache"),
        ("tokens_out", "tokens out"),
        ("compression_ratio", "compression ratio (document tokens / tokens kept)"),
        ("acceptance_rate", "draft acceptance rate"),
        ("draft_tokens", "  of tokens drafted"),
        ("tokens_per_step", "tokens per decode step (1: speculation saved no step)"),
        ("docs_per_s", f"docs/s ({summary.get('throughput_basis') or 'wall'} time)"),
        ("output_tokens_per_s", "output tokens/s"),
        ("p50_e2e_s", "p50 latency (s)"),
        ("p95_e2e_s", "p95 latency (s)"),
        ("wall_s", "wall time (s)"),
        ("cost_usd", "total cost (USD: device time + text compression)"),
    ]
    if summary.get("device_s"):  # where the time went (module docstring): row seconds, summed
        keys += [("device_s", "device time (s), of it:"),
                 ("time_method_read_s", "  the method reading documents"),
                 ("time_prompt_prefill_s", "  prompt prefill"),
                 ("time_decode_s", "  decode")]
        if summary.get("time_text_compress_s"):
            keys += [("time_text_compress_s", "text compression before the engine (s, in the cost)")]
        if summary.get("rows") and summary.get("time_stall_s") is not None:
            summary = {**summary, "mean_stall_s": summary["time_stall_s"] / summary["rows"]}
            keys += [("mean_stall_s", "a row's wait on others' prefill (mean s)")]
    if "skipped" in summary:  # a run's own summary (`report` summarizes rows): the date beside it
        at = keys.index(("status", "status"))
        keys[at:at] = [("skipped", "requests already done (skipped)")]
        keys[at + 2:at + 2] = [("date_rows", "rows of the date (all runs)"), ("date_failed", "  of them failed")]
        if summary.get("superseded"):  # stages/partition.py ``superseded``
            keys[at + 1:at + 1] = [("superseded", "earlier rows it replaced")]
    if "rows_published" in summary:  # `report` of a run whose rows are not in the table
        at = keys.index(("rows", "rows (requests)")) + 1
        keys[at:at] = [("rows_published", "  of them published"), ("note", "  why")]
    elif summary.get("note"):  # `report` of a run that wrote rows and no record of its end
        at = keys.index(("status", "status")) + 1
        keys[at:at] = [("note", "  why")]
    if "method" in summary:  # `report`: what the run read with, first
        keys[0:0] = [("model", "model"), ("method", "compression"), ("target_tokens", "  budget (tokens)"),
                     ("max_new_tokens", "max new tokens")]
    if summary.get("answers_scored"):  # only where the input had references
        keys += [("answers_scored", "answers with a reference (failed rows count as wrong)"),
                 ("answers_contain", "  containing the reference"),
                 ("answers_exact", "  equal to the reference")]
    if summary.get("cut_off") is None:  # rows written before the finish_reason column
        keys.remove(("cut_off", "  of them cut at max_new_tokens"))
    if not summary.get("cut_repeat"):  # generation.repeat_guard is off by default
        keys.remove(("cut_repeat", "  of them cut by the repeat guard"))
    if summary.get("nothing_to_do"):  # a rerun that found every request done: its settings and why
        # (`longdoc run`'s own summary of it keeps what the date holds: pipeline/runner.py)
        keys = [k for k in keys if k[0] in ("model", "method", "target_tokens", "max_new_tokens", "skipped",
                                             "status", "note", "date_rows", "date_failed")]
    width = max(len(label) for _, label in keys)
    lines = [f"== {title} =="]
    lines += [f"  {label.ljust(width)}  {_fmt(summary.get(k))}" for k, label in keys]
    return "\n".join(lines)
