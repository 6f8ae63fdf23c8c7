"""`longdoc eval`: one QA eval set through the real pipeline, once per method and budget.

Contract:
- The runs and their specs come from pipeline.eval.specs (every budgeted method once
  per ``target_tokens``, none/autocompressor once); run outputs land under
  ``{out}/{eval_id}/runs/{method}-{budget}``.
- ``run_eval`` runs each spec with ``pipeline.runner.run_job``, reads the rows back,
  scores them (pipeline.eval.table) and writes, under ``{out}/{eval_id}/``:
  summary.md / summary.csv / summary.json (per method and budget, plus breakdowns by
  question style, kind and answer depth), scored.csv (one line per request) and
  eval.png. The printed table shows every method per question style
  (pipeline.eval.table.per_style, "contains").
  Each run goes through the runner ``longdoc run`` would pick (``runner``, default
  ``auto``: in this process without Ray when there is no cluster and one generate actor,
  else Ray; pipeline.placement.resolve_runner): on a laptop an embedded Ray only competes with
  the one engine for the cores. The generate engine's cores are the spec's
  ``resources.num_cpus`` (``auto``: every core without a cluster; pipeline.placement
  ``with_actor_cpus``). A run that raises is reported and skipped;
  the others go on. Reusing an
  ``eval_id`` resumes: requests already written are skipped by the pipeline, and
  a resumed run reports no wall time per request (``-``; its e2e_s still counts).
- ``metrics`` picks what is measured: "qa" (the above) and/or "nll" (pipeline/eval/nll.py:
  continuation NLL of every method at each of ``nll_budgets``, in-process, one model at
  a time, no Ray). NLL rows join the same summary table and plot (``task`` "nll"), their
  per-document rows go to scored_nll.csv. NLL is recomputed on resume.
- Evidence recall (pipeline/eval/recall.py): every qa row is also scored on whether the
  answer-bearing sentence survived compression (its ``kept_spans``), whatever the reader
  answered; summary.md gains a table of evidence recall per question style, and
  cost_quality.png (pipeline/eval/plot.py) plots accuracy and recall against seconds
  per question, one point per method and budget.
- Equal reading (``equal_reading``: reference methods, e.g. finch): after the reference
  ran at budget B, each of ``equal_methods`` (default rag, bm25) runs again with
  target_tokens = the reference's mean context_tokens at B (rounded; at least 1), its
  summary row's ``equal_to`` = "REF@B". A reference that failed at B skips those runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.choices import RUNNERS, Runner
from pipeline.eval.checks import check_eval_set
from pipeline.eval.nll import (
    DEFAULT_CONTINUATION,
    DEFAULT_NLL_BUDGETS,
    DEFAULT_QUERY_TOKENS,
    aggregate_nll,
    read_eval_documents,
    run_nll,
)
from pipeline.eval.recall import EvidenceIndex, evidence_for
from pipeline.eval.specs import (
    EvalRun,
    build_eval_spec,
    equal_reading_plan,
    load_question_meta,
    plan_runs,
    split_overrides,
)
from pipeline.eval.table import (
    SUMMARY_COLUMNS,
    aggregate,
    breakdown,
    legend,
    per_style,
    score_rows,
    to_markdown,
    write_csv,
)
from pipeline.host_load import busy_note, load_now

DEFAULT_BUDGETS = (512, 1024)
METRIC_NAMES = ("qa", "nll")
# The report part: figures are reported on it; defaults are tuned on qa-tuning.jsonl
# (pipeline/corpus/eval_records.py PARTS, jobs/README.md).
DEFAULT_EVAL_SET = "jobs/eval/qa-report.jsonl"


@dataclass
class EvalResult:
    eval_id: str
    out_dir: Path
    summary: list[dict[str, Any]]
    by_kind: list[dict[str, Any]]
    by_depth: list[dict[str, Any]]
    scored: list[dict[str, Any]]
    by_style: list[dict[str, Any]] = field(default_factory=list)
    scored_nll: list[dict[str, Any]] = field(default_factory=list)
    failed_runs: dict[str, str] = field(default_factory=dict)  # run tag -> error
    recall_by_style: list[dict[str, Any]] = field(default_factory=list)  # evidence_recall per style
    busy: str | None = None  # the machine was busy while it ran: its time columns are not a measurement


def _read_rows(output_uri: str) -> list[dict[str, Any]]:
    from pipeline.report.load import load_output

    rows: dict[str, dict[str, Any]] = {}
    for r in load_output(output_uri).to_pylist():
        rows[r["request_id"]] = r  # a resumed run may hold rows of several dates
    return list(rows.values())


def run_eval(
    eval_set: str = DEFAULT_EVAL_SET,
    target_tokens: list[int] | None = None,
    methods: list[str] | None = None,
    *,
    limit: int | None = None,
    max_new_tokens: int = 32,
    out: str = "out/eval",
    overrides: list[str] | None = None,
    autocompressor: str | None = None,
    eval_id: str | None = None,
    address: str | None = None,
    progress: bool = True,
    metrics: list[str] | None = None,
    nll_budgets: list[int] | None = None,
    continuation_tokens: int = DEFAULT_CONTINUATION,
    query_tokens: int = DEFAULT_QUERY_TOKENS,
    equal_reading: list[str] | None = None,
    equal_methods: list[str] | None = None,
    runner: str = "auto",
) -> EvalResult:
    """Run, score and write the eval; see the module contract. Bad values raise ValueError."""
    from pipeline.placement import resolve_runner
    from pipeline.runner import new_run_id, run_job, today_utc

    if runner not in RUNNERS:
        raise ValueError(f"--runner {runner!r}: allowed {', '.join(RUNNERS)}")

    local = Path(eval_set)
    if "://" not in eval_set and not local.exists():
        fix = "build it: see jobs/README.md" if eval_set == DEFAULT_EVAL_SET else "give the path of your JSONL file"
        raise ValueError(f"eval set {eval_set!r} not found ({local.resolve()}); {fix}")
    eval_uri = str(local.resolve()) if "://" not in eval_set else eval_set
    wanted = [m.strip() for item in metrics or ["qa"] for m in item.split(",") if m.strip()]
    if not wanted or any(m not in METRIC_NAMES for m in wanted):
        raise ValueError(f"--metrics {wanted}: allowed {', '.join(METRIC_NAMES)} (comma-separated)")
    load_start = load_now()
    if "qa" in wanted:  # continuation NLL reads texts only
        checked = check_eval_set(eval_uri)
        if checked.refusals:
            raise ValueError("; ".join(checked.refusals))
        for note in checked.notes:
            typer.echo(f"eval: note: {note}", err=True)
    runs = plan_runs(methods, list(target_tokens or DEFAULT_BUDGETS), autocompressor) if "qa" in wanted else []
    nll_runs = plan_runs(methods, list(nll_budgets or DEFAULT_NLL_BUDGETS), autocompressor) if "nll" in wanted else []
    refs, others = equal_reading_plan(equal_reading, equal_methods, runs)
    common, scoped = split_overrides(list(overrides or []), {r.method for r in runs + nll_runs} | set(others))
    eval_id = eval_id or new_run_id()
    out_dir = Path(out) / eval_id

    def spec_of(r: EvalRun):
        return build_eval_spec(
            r,
            eval_uri,
            str((out_dir / "runs" / r.tag).resolve()),
            max_new_tokens=max_new_tokens,
            limit=limit,
            overrides=common + scoped.get(r.method, []),
            autocompressor=autocompressor,
        )

    specs = {r.tag: spec_of(r) for r in dict.fromkeys(runs + nll_runs)}
    for m in others:  # an equal-reading run's budget is known later: check its spec now
        spec_of(EvalRun(m, 1))
    # every spec is validated before the first run starts, its budgets against the model's
    # context too (a budget select cannot fit failed after bm25 had run for a minute)
    from pipeline.plan import spec_problems

    problems = [f"run {tag}: {p}" for tag, spec in specs.items() for p in spec_problems(spec)]
    if problems:
        raise ValueError("; ".join(problems))
    _note_runs_left_out(out_dir, {r.method for r in runs + nll_runs} | set(others))
    scored: list[dict[str, Any]] = []
    wall: dict[tuple[str, int | None], float] = {}
    failed: dict[str, str] = {}
    scored_nll = run_nll(
        nll_runs, specs, read_eval_documents(eval_uri, limit), continuation_tokens=continuation_tokens,
        query_tokens=query_tokens, failed=failed, progress=progress,
    ) if nll_runs else []  # fmt: skip
    meta = load_question_meta(eval_uri) if runs else {}
    evidence = _evidence(eval_uri, specs[runs[0].tag]) if runs else {}
    equal_to: dict[tuple[str, int | None], str] = {}
    queue = list(runs)
    while queue:
        r = queue.pop(0)
        t0 = time.perf_counter()
        try:
            res = run_job(
                specs[r.tag],
                run_date=today_utc(),
                run_id=eval_id,
                address=address,
                progress=progress,
                runner=resolve_runner(runner, specs[r.tag], address),
            )
        except Exception as e:  # noqa: BLE001 - one broken method must not sink the others
            failed[r.tag] = f"{type(e).__name__}: {e}"
            typer.echo(f"eval: run {r.tag} failed: {failed[r.tag]}", err=True)
            continue
        if res.summary.get("taken_over"):  # its date's lease lost or not renewed (pipeline/date_lease.py)
            failed[r.tag] = f"published nothing: {res.summary['taken_over']}; rerun with --eval-id {eval_id}"
            typer.echo(f"eval: run {r.tag} failed: {failed[r.tag]}", err=True)
            continue
        if res.summary.get("status") == "failed":  # Ray gave up: rows are retryable errors
            failed[r.tag] = f"run aborted: {res.summary.get('abort_reason')}; rerun with --eval-id {eval_id}"
            typer.echo(f"eval: run {r.tag} failed: {failed[r.tag]}", err=True)
        if "wall_s_all_attempts" in res.summary:  # a resumed eval id: every attempt's time
            wall[(r.method, r.target_tokens)] = res.summary["wall_s_all_attempts"]
        elif not res.skipped:  # rows done under another id: this wall time covers only the rest
            wall[(r.method, r.target_tokens)] = res.summary.get("wall_s") or time.perf_counter() - t0
        rows = score_rows(r.method, r.target_tokens, _read_rows(res.output_uri), meta, evidence)
        scored += rows
        bad = [x for x in rows if x.get("error")]
        if bad:  # the table counts them as wrong answers; the reason is said here, not only in scored.csv
            typer.echo(f"eval: run {r.tag}: {len(bad)} of {len(rows)} row(s) failed; the first: {bad[0]['error']}",
                       err=True)
        if r.equal_to:
            equal_to[(r.method, r.target_tokens)] = r.equal_to
        elif r.method in refs and r.target_tokens is not None:
            reading = [x["context_tokens"] for x in rows if x["error"] is None and x["context_tokens"]]
            if reading:
                n = max(1, round(sum(reading) / len(reading)))
                for m in others:
                    eq = EvalRun(m, n, equal_to=f"{r.method}@{r.target_tokens}")
                    specs[eq.tag] = spec_of(eq)
                    queue.append(eq)
    result = EvalResult(
        eval_id=eval_id,
        out_dir=out_dir,
        summary=aggregate(scored, wall, equal_to) + aggregate_nll(scored_nll),
        by_kind=breakdown(scored, "kind"),
        by_depth=breakdown(scored, "depth_bin"),
        scored=scored,
        by_style=per_style(scored),
        scored_nll=scored_nll,
        failed_runs=failed,
        recall_by_style=per_style(scored, "evidence_recall"),
        busy=busy_note([load_start, load_now()], os.cpu_count()),
    )
    _write(result, eval_uri, runs)
    return result


def _note_runs_left_out(out_dir: Path, methods: set[str]) -> None:
    """A resumed eval id's runs of methods this call does not list: its summary is rewritten
    from this call's runs alone, so say which ones it leaves out and how to keep them."""
    runs_dir = out_dir / "runs"
    if not runs_dir.is_dir():
        return
    other = sorted(d.name for d in runs_dir.iterdir() if d.is_dir() and d.name.split("-")[0] not in methods)
    if other:
        typer.echo(f"eval: note: {out_dir.name} also holds runs of {', '.join(other)}; this summary leaves them out "
                   "(list their methods in --methods to keep them in it: their rows are reused)", err=True)


def _evidence(eval_uri: str, spec) -> EvidenceIndex:
    """The eval set's evidence in the tokens of ``spec``'s method (the generating model's)."""
    from stages.compression import method_for
    from stages.model_loading import load_tokenizer

    return evidence_for(eval_uri, load_tokenizer(method_for(spec.compression).tokenizer_source(spec)))


def _write(result: EvalResult, eval_set: str, runs: list[EvalRun]) -> None:
    from pipeline.eval.plot import plot_cost_quality, plot_eval

    d = result.out_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.md").write_text(render_markdown(result) + "\n", encoding="utf-8")
    write_csv(result.summary, d / "summary.csv", SUMMARY_COLUMNS)
    if result.scored:
        write_csv(result.scored, d / "scored.csv")
    if result.scored_nll:
        write_csv(result.scored_nll, d / "scored_nll.csv")
    payload = {
        "eval_id": result.eval_id,
        "eval_set": eval_set,
        "runs": [r.tag for r in runs],
        "failed_runs": result.failed_runs,
        "summary": result.summary,
        "by_style": result.by_style,
        "recall_by_style": result.recall_by_style,
        "busy": result.busy,
        "by_style_detail": breakdown(result.scored, "style"),
        "by_kind": result.by_kind,
        "by_depth": result.by_depth,
    }
    (d / "summary.json").write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
    if result.summary:
        plot_eval(
            result.summary,
            result.by_depth,
            d / "eval.png",
            title=f"longdoc eval {result.eval_id}",
        )
    if any(s.get("task", "qa") == "qa" for s in result.summary):
        plot_cost_quality(result.summary, d / "cost_quality.png", title=f"longdoc eval {result.eval_id}")


def render_markdown(result: EvalResult) -> str:
    title = "QA and continuation-NLL eval" if result.scored_nll else "QA eval"
    parts = [f"## {title} {result.eval_id}", "", to_markdown(result.summary, SUMMARY_COLUMNS), "",
             legend(SUMMARY_COLUMNS)]
    if result.by_style:
        parts += ["", "### contains by question style", "", to_markdown(result.by_style)]
    elif any(s.get("task", "qa") == "qa" for s in result.summary):
        parts += ["", "(No table by question style: the eval set's records have no `style` field; "
                      "jobs/README.md, \"Formats\".)"]
    if any(v is not None for r in result.recall_by_style for k, v in r.items() if k not in ("method", "target_tokens")):
        parts += ["", "### evidence recall by question style (answer sentence kept whole; reader-independent)",
                  "", to_markdown(result.recall_by_style)]
    if result.by_kind:
        parts += ["", "### by question kind", "", to_markdown(result.by_kind)]
    if result.busy:
        parts += ["", f"**Note:** {result.busy}: the time columns are not a measurement; compare methods' "
                      "times in one eval on a quiet machine."]
    if result.failed_runs:
        parts += ["", "### failed runs", ""] + [
            f"- {k}: {v}" for k, v in result.failed_runs.items()
        ]
    return "\n".join(parts)


def eval_command(
    eval_set: Annotated[
        str, typer.Option(help="QA eval set (JSONL: id, text, questions, answers[, depths, kind, style]); default: the report part.")
    ] = DEFAULT_EVAL_SET,
    target_tokens: Annotated[
        list[int] | None,
        typer.Option(help="Context budget; repeatable (default: 512 and 1024)."),
    ] = None,
    methods: Annotated[
        list[str] | None,
        typer.Option(
            help="Methods to compare, repeatable or comma-separated (default: every method of stages/compression/; autocompressor only with --autocompressor)."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first N documents.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens generated per answer.")] = 32,
    out: Annotated[
        str,
        typer.Option(
            help="Directory for the table, plot and run outputs (a subfolder per eval id)."
        ),
    ] = "out/eval",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Spec override for every run (generation.model=DIR), or METHOD:key=value for one method.",
        ),
    ] = None,
    autocompressor: Annotated[
        str | None,
        typer.Option(help="AutoCompressor checkpoint; adds the autocompressor method."),
    ] = None,
    eval_id: Annotated[
        str | None, typer.Option(help="Reuse an eval id to resume it (default: new).")
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster address (default: embedded Ray where Ray runs).")
    ] = None,
    runner: Annotated[
        Runner,
        typer.Option(help="As for longdoc run: local = each run's stages in this process, without Ray; "
                     "auto = local when there is no cluster (no --address, no $RAY_ADDRESS) and "
                     "resources.actors is 1, else ray."),
    ] = Runner.auto,
    quiet: Annotated[bool, typer.Option(help="No progress output.")] = False,
    metrics: Annotated[
        list[str] | None,
        typer.Option(help="qa and/or nll (continuation NLL given the compressed earlier text), comma-separated (default: qa)."),
    ] = None,
    nll: Annotated[bool, typer.Option("--nll", help="Shorthand for --metrics qa,nll.")] = False,
    nll_budgets: Annotated[
        str, typer.Option(help="NLL context budgets, comma-separated.")
    ] = ",".join(map(str, DEFAULT_NLL_BUDGETS)),
    continuation_tokens: Annotated[
        int, typer.Option(help="NLL: the document's last N tokens are the scored continuation.")
    ] = DEFAULT_CONTINUATION,
    query_tokens: Annotated[
        int, typer.Option(help="NLL: query for rag/bm25/finch = the earlier text's last N tokens.")
    ] = DEFAULT_QUERY_TOKENS,
    equal_reading: Annotated[
        list[str] | None,
        typer.Option(help="Equal reading: after METHOD ran at a budget, run --equal-methods at the mean tokens it kept (repeatable or comma-separated)."),
    ] = None,
    equal_methods: Annotated[
        list[str] | None,
        typer.Option(help="Methods run at --equal-reading's mean reading (default: rag,bm25)."),
    ] = None,
) -> None:
    """Compare every compression method on a QA eval set at the same context budget."""
    from schemas.loading import SpecError

    try:
        try:
            budgets = [int(b) for b in nll_budgets.split(",") if b.strip()]
        except ValueError:
            raise ValueError(f"--nll-budgets {nll_budgets!r}: comma-separated integers, e.g. 128,256,512") from None
        result = run_eval(
            eval_set,
            target_tokens,
            methods,
            limit=limit,
            max_new_tokens=max_new_tokens,
            out=out,
            overrides=set_,
            autocompressor=autocompressor,
            eval_id=eval_id,
            address=address,
            progress=not quiet,
            metrics=["qa,nll"] if nll and not metrics else metrics,
            nll_budgets=budgets,
            continuation_tokens=continuation_tokens,
            query_tokens=query_tokens,
            equal_reading=equal_reading,
            equal_methods=equal_methods,
            runner=Runner(runner).value,
        )
    except (ValueError, SpecError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(render_markdown(result))
    typer.echo(
        f"\nwritten: {result.out_dir}/summary.md, summary.csv, summary.json, scored*.csv, eval.png, cost_quality.png"
    )
    if result.failed_runs:
        raise typer.Exit(1)
