"""`longdoc report`: every run's summary from an output's files, its answers and a plot.

Reads only what a run leaves: the rows under ``{output}/run_date=D/`` and the run records
beside them (pipeline/report/load.py), so any output root works, local or in object
storage, whatever machine wrote it. Output: one summary block per run, then one line a
date (pipeline/report/dates.py; `--dates` prints only that), or JSON; then on request the
newest date's answers and a PNG. Exit 2 when the root holds no output (the
message names the near miss: a missing folder, one date's folder, roots below it).
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer


def report(
    output_uri: Annotated[str, typer.Argument(help="Output table root (the spec's output.uri).")],
    plot: Annotated[Optional[str], typer.Option(help="Also draw a PNG report here.")] = None,  # noqa: UP045
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    last: Annotated[int, typer.Option(min=1, help="Plot at most the newest N runs.")] = 30,
    answers: Annotated[int, typer.Option(
        min=0, help="Also print the first N answers of the newest run date (or --date's): document, question, "
        "answer or error, reference (with --json: {\"runs\": [...], \"answers\": [...]}).")] = 0,
    dates: Annotated[bool, typer.Option(
        "--dates", help="Print only the view by date: one line a date (status, rows, failed, latest run, "
        "settings, cost, what to do next), the days a daily job missed, the totals "
        "(with --json: {\"dates\": [...], \"totals\": {...}}).")] = False,
    since: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Only the run dates from this one on (YYYY-MM-DD).")] = None,
    date: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Only this run date (YYYY-MM-DD): its runs, its line, its answers.")] = None,
) -> None:
    """Summarise the Parquet output of one or more runs: each run, then one line a date."""
    from pipeline.preflight import readable_problem
    from pipeline.report.load import load_output, run_summaries

    problem = readable_problem("OUTPUT_URI", output_uri)
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    from schemas.loading import SpecError, check_run_date

    for name, value in (("--since", since), ("--date", date)):
        try:
            if value is not None:
                check_run_date(value, name)
        except SpecError:
            typer.echo(f"error: {name} {value!r} is not a date: give it as YYYY-MM-DD, e.g. 2026-01-31", err=True)
            raise typer.Exit(2) from None
    if since is not None and date is not None:
        typer.echo("error: --since and --date together: give one (--date for one date, --since for the dates "
                   "from one on)", err=True)
        raise typer.Exit(2)
    table = load_output(output_uri)
    summaries = run_summaries(output_uri, table)  # with the recorded runs that have no row here
    if not summaries:
        from pipeline.report.load import output_root_hint

        typer.echo(f"error: no rows and no run records under {output_uri}{output_root_hint(output_uri)}", err=True)
        raise typer.Exit(2)
    if since is not None or date is not None:
        import pyarrow.compute as pc

        first, last_date = date or since, date or "9999-12-31"
        table = table.filter(pc.and_(pc.greater_equal(table["run_date"], first),
                                     pc.less_equal(table["run_date"], last_date)))
        summaries = [s for s in summaries if first <= s["run_date"] <= last_date]
        if not summaries:
            when = f"on {date}" if date else f"on or after {since}"
            typer.echo(f"error: no run of {output_uri} {when}", err=True)
            raise typer.Exit(2)
    if dates:
        from pipeline.report.dates import date_view, format_dates

        view = date_view(table, summaries)
        typer.echo(json.dumps(view, indent=2, default=str) if as_json else format_dates(view))
        _say_outdated(output_uri)
        _say_links(output_uri)
        return
    if as_json and answers and table.num_rows:  # the runs and the answers, one JSON object
        from pipeline.report.answers import answer_rows

        typer.echo(json.dumps({"runs": summaries, "answers": answer_rows(table, answers)}, indent=2, default=str))
    elif as_json:
        typer.echo(json.dumps(summaries, indent=2, default=str))
    else:
        from pipeline.report.dates import date_view, format_dates
        from pipeline.report.summary import format_summary

        for s in summaries:
            job = f"{s['job']} " if s.get("job") else ""
            typer.echo(format_summary(s, title=f"{job}{s['run_date']} ({s['run_id']})"))
        typer.echo(format_dates(date_view(table, summaries)))
    _say_outdated(output_uri)
    _say_links(output_uri)
    if answers and not as_json and table.num_rows:
        from pipeline.report.answers import format_answers

        typer.echo(format_answers(table, answers))
    if plot and table.num_rows:
        from pipeline.report.plot import plot_report

        plot_report(table, plot, summaries=[s for s in summaries if "rows_published" not in s], last=last)
        typer.echo(f"plot: {plot}")


def _say_links(output_uri: str) -> None:
    """A note (stderr) naming the links a scan of the output skipped (stages/links.py): their
    rows are in no figure above."""
    from stages.links import skipped_links

    links = skipped_links(output_uri)
    if links:
        link, target = links[0]
        typer.echo(f"note: {len(links)} link(s) inside the output were skipped, their rows counted nowhere "
                   f"above (the first: {link} -> {target}): longdoc reads no links inside an output, and a "
                   "run of such a date is refused; fix: move the files into the output in place of the link",
                   err=True)


def _say_outdated(output_uri: str) -> None:
    """A note (stderr) when files of the output have an older schema's columns, which the
    readers the README names do not read as one table (pipeline/ops/upgrade.py)."""
    from pipeline.report.load import outdated_files

    by_date = outdated_files(output_uri)
    if by_date:
        dates = sorted(by_date)
        span = dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}"
        typer.echo(f"note: {sum(map(len, by_date.values()))} file(s) of {len(dates)} date(s) ({span}) were written "
                   "by an earlier longdoc, with fewer columns: pandas and DuckDB read the folder with one file's "
                   f"columns and Polars refuses it; run `longdoc upgrade {output_uri}` once, when no job writes "
                   "to it", err=True)
