"""`longdoc upgrade OUT`: give an output's files written by an earlier longdoc the current columns.

Why: each version of the output schema appends columns (schemas/output.py). Readers take a
folder's columns from one of its files: pandas and DuckDB read every date with the first
file's columns (a newer column vanishes from every date), Polars refuses the folder ("extra
column in file outside of expected schema"). A run upgrades the date it commits
(stages/partition.py ``commit_date``); this command does the other dates once, after an
upgrade of longdoc. Each file is rewritten whole under its own name (atomically: a
reader sees the old file or the new one), its rows and values unchanged and the new
columns null. Each date is rewritten holding its lease (pipeline/date_lease.py), as a
run publishes; a date that a run writes now is left to that run, whose commit upgrades it.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated

import typer


def upgrade(
    output_uri: Annotated[str, typer.Argument(help="Output table root (the spec's output.uri).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list the files an upgrade would rewrite.")] = False,
) -> None:
    """Rewrite the output's files an earlier longdoc wrote with the current columns (new ones null).

    Exits 75 when a date was left to the run writing it now (its commit upgrades it; or try later).
    """
    from pipeline.date_lease import DateInUse, DateLease, LinkedLease
    from pipeline.preflight import readable_problem
    from pipeline.report.load import list_output_files, outdated_files, output_root_hint
    from stages.links import LinkedOutput
    from stages.partition import upgrade_date

    problem = readable_problem("OUTPUT_URI", output_uri)
    if not problem and not list_output_files(output_uri)[1]:
        problem = f"no output files under {output_uri}{output_root_hint(output_uri)}"
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    by_date = outdated_files(output_uri)
    total = sum(map(len, by_date.values()))
    if not total:
        typer.echo(f"{output_uri}: every file has the current columns; nothing to do")
        return
    dates = len(by_date)
    for run_date, paths in sorted(by_date.items()):
        if dry_run:
            typer.echo(f"{run_date}: {len(paths)} file(s) to upgrade")
            continue
        # A date's files are rewritten holding its lease, as a run publishes (one writer).
        lease = DateLease(output_uri, run_date, f"upgrade-{uuid.uuid4().hex[:6]}", "longdoc upgrade",
                          say=lambda msg: typer.echo(msg, err=True))
        try:
            lease.acquire()
        except DateInUse as e:  # its commit upgrades the date itself
            typer.echo(f"{run_date}: {len(paths)} file(s) left: {e.holder.describe(time.time()) if e.holder else e} "
                       "writes this date now, and upgrades its files when it publishes")
            total, dates = total - len(paths), dates - 1
            continue
        except OSError as e:  # the lease's storage: said like run says it
            typer.echo(f"error: storage: {type(e).__name__}: {e}; nothing of {run_date} was rewritten", err=True)
            raise typer.Exit(1) from None
        except (LinkedLease, LinkedOutput) as e:  # a link planted in the output's folders: never followed
            typer.echo(f"error: {e}; nothing of {run_date} was rewritten", err=True)
            raise typer.Exit(2) from None
        try:
            upgrade_date(output_uri, run_date, paths)
        finally:
            lease.release()
        typer.echo(f"{run_date}: {len(paths)} file(s) upgraded")
    verb = "would rewrite" if dry_run else "rewrote"
    typer.echo(f"{output_uri}: {verb} {total} file(s) of {dates} date(s)")
    if dates < len(by_date):  # a script must see that dates were left: try later, as `run` says
        from pipeline.date_lease import DATE_IN_USE_EXIT

        raise typer.Exit(DATE_IN_USE_EXIT)
