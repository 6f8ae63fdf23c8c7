"""`longdoc` command line. Every command validates its spec before Ray starts."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.choices import RetryErrors, Runner
from schemas.environment import check_environment
from schemas.loading import SpecError, check_run_date, check_run_id, load_spec

# Plain help and errors (rich_markup_mode=None): rich's boxes cut long option names to fit an
# 80-column terminal ("--autoencode-wei…"); click's layout wraps the help text instead.
app = typer.Typer(
    help="Batch long-document LLM jobs: compressed context, speculative decoding, Parquet out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Benchmarks that print side-by-side ratios.", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(bench_app, name="bench")

SetOpt = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional here
    typer.Option("--set", help="Override a spec field: --set generation.max_new_tokens=64 (repeatable)."),
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"longdoc {version('longdoc')}")
        except PackageNotFoundError:  # a checkout run without `pip install -e .`
            typer.echo("longdoc (not installed; version unknown)")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Batch long-document LLM jobs: compressed context, speculative decoding, Parquet out."""
    import os

    from pipeline.ray_console import MODEL_STACK_ENV

    # Before any command imports the model stack: its bars and notices (e.g. transformers'
    # "Loading weights" bar under `eval`) are read from the environment at import time.
    for name, value in MODEL_STACK_ENV.items():
        os.environ.setdefault(name, value)  # a user's own setting wins


def _load(spec_path: str, overrides: list[str] | None, run_date: str | None = None, local_paths: bool = True):
    """The validated spec, or exit 2 naming every problem (spec and this machine) before Ray starts."""
    try:
        job = load_spec(spec_path, overrides or [])
    except SpecError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    from pipeline.plan import spec_problems

    problems = check_environment(job, run_date=run_date, local_paths=local_paths,
                                 spec_dir=Path(spec_path).parent) + spec_problems(job)
    if problems:
        typer.echo(f"job spec {spec_path} cannot run here:", err=True)
        for p in problems:
            typer.echo(f"  - {p}", err=True)
        raise typer.Exit(2)
    return job


def _check_args(date: str | None = None, run_id: str | None = None) -> None:
    try:
        if date is not None:
            check_run_date(date)
        if run_id is not None:
            check_run_id(run_id)
    except SpecError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command()
def validate(
    spec: Annotated[Optional[str], typer.Argument(help="Path of the YAML job spec.")] = None,  # noqa: UP045
    set_: SetOpt = None,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the JSON Schema of a job spec (for editors) and exit.")
    ] = False,
    skip_storage: Annotated[
        bool, typer.Option("--skip-storage", help="Skip the storage checks (listing the input, reading its "
                           "first records, test-writing the output): for a spec whose credentials exist "
                           "only where it runs.")
    ] = False,
    date: Annotated[Optional[str], typer.Option(  # noqa: UP045
        help="Check the input of this run date YYYY-MM-DD (a spec whose input.uri holds {run_date}); "
             "without it such an input is left to `run`.")] = None,
) -> None:
    """Validate a job spec and print it with every default resolved (exit 2 if invalid).

    Also checks, with this process's credentials, that the input can be listed and has
    the spec's fields and that the output can be written (unless --skip-storage)."""
    import yaml

    if schema:
        from schemas.loading import spec_json_schema

        typer.echo(json.dumps(spec_json_schema(), indent=2))
        return
    if spec is None:
        typer.echo("error: missing SPEC (or pass --schema)", err=True)
        raise typer.Exit(2)
    _check_args(date)
    job = _load(spec, set_, run_date=date)
    _check_local_input(job, spec, date)
    if not skip_storage:
        _preflight(job, date)
    shown_spec = job.model_dump(mode="json")
    shown_spec["task"]["instruction"] = job.task.resolved_instruction  # the default's text, not null
    typer.echo(yaml.safe_dump(shown_spec, sort_keys=False))
    # What passed, as a YAML comment: the output stays a spec a user can save and run.
    typer.echo(f"# {spec}: valid; {_validated(job, skip_storage, date)}")
    from pipeline.placement import crowded_note

    if note := crowded_note(job, None):
        typer.echo(f"# note: {note}")


def _validated(job, skip_storage: bool, run_date: str | None = None) -> str:
    """What ``validate`` checked beyond the spec itself, in words (the preflight's scope)."""
    if skip_storage:
        return "storage not checked (--skip-storage): `run` checks it before the model loads"
    output = f"the output {job.output.uri.replace('{job}', job.name)} can be written"
    from pipeline.placement import cluster_address

    if cluster_address(None) is None:
        output += "; the models it loads are found on this machine"
    if "{run_date}" in job.input.uri and run_date is None:
        return f"{output}; the input's URI needs a run date (--date), so `run` checks its records"
    fields = ", ".join(f for f in (job.input.id_field, job.input.text_field, job.input.question_field,
                                   job.input.answer_field) if f)
    from pipeline.fits import first_fit
    from pipeline.preflight import first_records_note, skipped_note

    what = "its files are found" if job.input.format == "text" else f"its first records have {fields}"
    fit = first_fit(job, run_date)
    return (f"the input {job.input.uri.replace('{run_date}', run_date or '')} is listed and {what}"
            f"{first_records_note(job, run_date)}{fit.note() if fit else ''}{skipped_note(job, run_date)}; {output}")


def _check_local_input(job, spec_path: str, run_date: str | None = None) -> None:
    """A local input is listed as the runner will list it: a folder without files of the
    format (a folder named ``x.jsonl``), or one holding a FIFO or a device, is refused
    here (exit 2), before Ray's import. Without a run date (``validate`` without
    ``--date``) an input with {run_date} is left to `run`, and so are remote inputs (their
    credentials may exist only where the job runs)."""
    uri = job.input.uri
    if ("{" in uri and run_date is None) or ("://" in uri and not uri.startswith("file://")):
        return
    from stages.listing import list_shards  # fsspec, not Ray

    try:
        list_shards(job.input, run_date or "")
    except ValueError as e:
        typer.echo(f"job spec {spec_path} cannot run here:\n  - {e}", err=True)
        raise typer.Exit(2) from None


def _preflight(job, run_date: str | None, address: str | None = None) -> None:
    """Exit 2 with one line per problem (pipeline/preflight.py) before any model loads; the
    models are looked for here unless the run goes to a Ray cluster (``address``, $RAY_ADDRESS)."""
    from pipeline.placement import cluster_address
    from pipeline.preflight import preflight

    problems = preflight(job, run_date, models_here=cluster_address(address) is None)
    for p in problems:
        typer.echo(f"error: {p}", err=True)
    if problems:
        raise typer.Exit(2)


@app.command()
def methods(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table (for docs).")] = False,
) -> None:
    """List the compression methods found in stages/compression/ and the drafters of
    generation.speculative.method found in stages/decoding/drafters/ (tables; --markdown: the
    methods' Markdown table)."""
    from stages.compression import methods_table

    if markdown:
        typer.echo(methods_table())
        return
    from rich.console import Console
    from rich.table import Table

    from stages.compression import registry
    from stages.compression.base import WHERE

    table = Table("method", "what it keeps", "where it runs", "paper", show_lines=True)
    for m in registry().values():  # the paper a method is named after, or what it is a baseline of
        table.add_row(m.name, m.summary, WHERE[m.runs_at], m.paper or "-")
    console = Console(soft_wrap=False)
    console.print(table)
    from stages.decoding.drafters import NONE
    from stages.decoding.drafters import registry as drafters

    # The drafters are found like the methods: a new module shows here with no edit elsewhere.
    speculative = Table("generation.speculative.method", "where its drafts come from", show_lines=True)
    speculative.add_row(NONE, "no drafts: plain decoding")
    for name, cls in drafters().items():
        speculative.add_row(name, cls.summary)
    console.print(speculative)


@app.command()
def run(
    spec: Annotated[str, typer.Argument(help="Path of the YAML job spec.")],
    set_: SetOpt = None,
    date: Annotated[Optional[str], typer.Option(help="Run date YYYY-MM-DD (default: today, UTC).")] = None,  # noqa: UP045
    run_id: Annotated[Optional[str], typer.Option(help="Run id (default: timestamp + random).")] = None,  # noqa: UP045
    address: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Ray cluster address (default: $RAY_ADDRESS, else an embedded local Ray)."),
    ] = None,
    max_failed_fraction: Annotated[
        float, typer.Option(help="Exit non-zero when more than this fraction of rows failed.")
    ] = 0.5,
    quiet: Annotated[bool, typer.Option(help="No progress output.")] = False,
    verbose: Annotated[
        bool, typer.Option(help="Show Ray's own console logs (also: LONGDOC_RAY_LOGS=1).")
    ] = False,
    retry_errors: Annotated[
        RetryErrors,
        typer.Option(help="Error rows of the date to redo and replace: all, retryable "
                     "(error_kind retryable: infrastructure) or none."),
    ] = RetryErrors.retryable,
    runner: Annotated[
        Runner,
        typer.Option(help="local: the stages in this process, without Ray. "
                     "auto: local when there is no cluster (no --address, no $RAY_ADDRESS) and "
                     "resources.actors is 1, else ray."),
    ] = Runner.auto,
) -> None:
    """Run a job and print its summary.

    Exit status: 0 done; 1 the run aborted, or over --max-failed-fraction of the date's rows failed (a rerun retries the retryable ones); 2 a bad spec, option or input, refused before anything ran (fix it first); 75 another run writes this date, or took it over from this one (try later; nothing to redo); 130 / 143 interrupted by SIGINT / SIGTERM (rerun the date: it publishes what was staged).
    """
    if verbose:
        import os

        os.environ["LONGDOC_RAY_LOGS"] = "1"  # read by pipeline.ray_console when Ray starts
    # Every check before the heavy imports and Ray: a bad spec or option exits 2 at once.
    retry_errors, runner = RetryErrors(retry_errors).value, Runner(runner).value
    _check_args(date, run_id)
    if not 0.0 <= max_failed_fraction <= 1.0:
        typer.echo(f"error: --max-failed-fraction: got {max_failed_fraction}; allowed: 0 to 1", err=True)
        raise typer.Exit(2)
    if retry_errors not in ("all", "retryable", "none"):
        typer.echo(f"error: --retry-errors: got {retry_errors!r}; allowed: all, retryable, none", err=True)
        raise typer.Exit(2)
    if runner not in ("auto", "ray", "local"):
        typer.echo(f"error: --runner: got {runner!r}; allowed: auto, ray, local", err=True)
        raise typer.Exit(2)
    from datetime import datetime, timezone

    # The runner's default date (today, UTC): a local input's {run_date} folder is checked too.
    run_date = date or datetime.now(timezone.utc).date().isoformat()
    job = _load(spec, set_, run_date=run_date)
    _check_local_input(job, spec, run_date)
    _preflight(job, run_date, address)
    from pipeline.placement import crowded_note, resolve_runner

    if note := crowded_note(job, address):
        typer.echo(f"note: {note}", err=True)
    from pipeline.date_lease import DATE_IN_USE_EXIT, DateInUse
    from pipeline.report.summary import format_summary
    from pipeline.runner import LEASE_LOST, LEASE_NOT_RENEWED, RunInterrupted, run_job

    restore = _interrupts_raise()
    try:
        result = run_job(job, run_date=date, run_id=run_id, address=address, progress=not quiet,
                         retry_errors=retry_errors, runner=resolve_runner(runner, job, address))
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except DateInUse as e:  # another run writes the date: try later (EX_TEMPFAIL, for schedulers)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(DATE_IN_USE_EXIT) from None
    except RunInterrupted as e:  # before the stages ran (Ray's start) or while publishing
        typer.echo(f"interrupted ({e}): staged rows are kept; run the same date again "
                   f"(--date {run_date}) to publish them and do the rest", err=True)
        _exit_now(128 + e.signum)
    except OSError as e:  # storage still failing after its retries (stages/storage.py)
        typer.echo(f"error: storage: {type(e).__name__}: {e}; rows already staged are kept and the "
                   "next run publishes them: run it again", err=True)
        raise typer.Exit(1) from None
    finally:
        restore()
    typer.echo(format_summary(result.summary, title=f"{job.name} {result.run_date} ({result.run_id})"))
    typer.echo(f"output: {result.output_uri}")
    s = result.summary
    if s.get("interrupted_by") in (LEASE_LOST, LEASE_NOT_RENEWED):  # pipeline/runner.py DateTakenOver
        then = ("the process holding the date publishes this run's staged rows, so there is nothing to rerun now"
                if s["interrupted_by"] == LEASE_LOST else
                "its rows are staged: run the same date again once the storage answers, to publish them")
        typer.echo(f"error: this run stopped and published nothing: {s.get('taken_over')}; {then}", err=True)
        raise typer.Exit(DATE_IN_USE_EXIT)
    if s.get("status") == "interrupted":
        signum = getattr(signal, s.get("interrupted_by") or "SIGINT", signal.SIGINT)
        typer.echo(f"interrupted ({s.get('interrupted_by')}): staged rows are kept; run the same date "
                   f"again (--date {result.run_date}) to publish them and do the rest", err=True)
        _exit_now(128 + int(signum))
    if s.get("status") == "failed":  # Ray aborted: unfinished requests are retryable error rows
        reason = s.get("abort_reason") or ""
        then = ("fix what it says, then run the date again: its rows wait as retryable error rows"
                if "could not start" in reason else "run it again to retry")
        typer.echo(f"error: run aborted ({reason}); {then}", err=True)
        from stages.layout import run_record_path

        record = run_record_path(result.output_uri, result.run_date, result.run_id)
        typer.echo(f"(its traceback: `abort_traceback` in {record})", err=True)
        raise typer.Exit(1)
    if s["date_rows"] and s["date_failed_fraction"] > max_failed_fraction:
        _say_errors(result, f"error: {s['date_failed']} of {s['date_rows']} rows of {result.run_date} failed "
                            f"({s['date_failed_fraction']:.0%} > --max-failed-fraction {max_failed_fraction:.0%})")
        raise typer.Exit(1)
    if s.get("failed"):  # under the threshold, but a row that failed is said, not left to find
        _say_errors(result, f"note: {s['failed']} row(s) of this run failed")
    if s.get("shared_ids"):  # pipeline/runner.py: ids that name documents in several files
        examples = "; ".join(f"{k!r} in {', '.join(v)}" for k, v in (s.get("shared_id_examples") or {}).items())
        typer.echo(f"note: {s['shared_ids']} document id(s) name documents in more than one input file ({examples}): "
                   "the same text there is one document, another text a second one with rows under the same "
                   "id (source_uri tells them apart); give them distinct ids (input.id_field)",
                   err=True)


def _say_errors(result, heading: str) -> None:
    """``heading``, the date's most frequent error messages, and where to see every row (stderr)."""
    from pipeline.report.load import date_errors
    from pipeline.report.safe_text import printable

    typer.echo(f"{heading}; the date's most frequent errors:", err=True)
    for message, n, kinds in date_errors(result.output_uri, result.run_date):
        said = printable(message[:300])  # it may quote a file name or an id from the input
        typer.echo(f"  {n} x {said}" if kinds == 1 else f"  {n} x errors like: {said}", err=True)
    typer.echo(f"  (every row: longdoc report {result.output_uri} --answers {result.summary['date_rows']})", err=True)


#: A second signal this soon after the first is the same stop sent twice, not a second
#: Ctrl-C: GNU ``timeout`` sends SIGTERM to its child and then to the child's process group
#: (the child again), microseconds apart, so ``timeout 3600 longdoc run`` always took the
#: "again: exiting now" path and ended without the run's record. A person pressing Ctrl-C
#: twice this fast gets the clean stop of the first and can press again.
SAME_SIGNAL_S = 0.5


def _interrupts_raise():
    """SIGINT and SIGTERM raise ``RunInterrupted`` in the main thread (the runner records the
    run as interrupted); a second one exits at once (staged rows are already durable), except
    the same signal again within ``SAME_SIGNAL_S``, which is the first's duplicate (ignored).
    Returns a function restoring the previous handlers."""
    from pipeline.runner import RunInterrupted

    first: list[tuple[int, float]] = []  # (signal, when): one entry, set before the raise

    def handler(signum, _frame):
        if first:
            was, at = first[0]
            if signum == was and time.monotonic() - at < SAME_SIGNAL_S:
                return  # the same stop sent twice (GNU timeout), not a second one
            print(f"\n{signal.Signals(signum).name} again: exiting now, without the run's record; the rows "
                  "staged so far are kept: run the same date again to publish them", file=sys.stderr, flush=True)
            _exit_now(128 + was)
        first.append((signum, time.monotonic()))
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    return lambda: [signal.signal(s, h) for s, h in previous.items()]


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: the atexit handlers run (Ray's shutdown, the
    stderr filter), then ``os._exit``. Why: an engine or Ray thread may still be inside
    torch or Ray's native code, and finalizing the interpreter under it aborts the process
    (``terminate called without an active exception``, SIGABRT, exit 134)."""
    import atexit
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _register_operations() -> None:
    """Commands implemented in their own modules (one job per module)."""
    from pipeline.bench.command import bench_decode_command
    from pipeline.bench.compress import bench_compress
    from pipeline.bench.job import bench_job_command
    from pipeline.eval.runner import eval_command
    from pipeline.ops.render import render
    from pipeline.ops.submit import logs, status, stop, submit
    from pipeline.ops.upgrade import upgrade
    from pipeline.report.command import report
    from pipeline.train.autocompressor import train_autocompressor
    from pipeline.train.calibrate_heads import calibrate_heads_command

    app.command(help="Submit a spec to a Ray cluster through the Ray Jobs API.")(submit)
    app.command(help="Status of a submitted job.")(status)
    app.command(help="Logs of a submitted job.")(logs)
    app.command(help="Stop a submitted job (its staged rows are kept).")(stop)
    app.command(help="Summarise the Parquet output of one or more runs.")(report)
    app.command(help="Print a KubeRay RayJob / RayCronJob manifest for a spec.")(render)
    app.command(help="Give an output's files written by an earlier longdoc the current columns.")(upgrade)
    bench_app.command(
        "decode",
        help="Decoding throughput: our engine (greedy, prompt lookup, suffix drafting) vs "
        "transformers (dynamic; static + compiled; its prompt lookup) with the memory roofline.",
    )(bench_decode_command)
    bench_app.command("compress", help="Finch vs full prefill: peak memory and time.")(bench_compress)
    bench_app.command("job", help="The whole job end to end vs the transformers script a user would write instead.")(bench_job_command)  # noqa: E501
    app.command("eval", help="QA accuracy, evidence recall, compression and time of every method at "
                "each budget, per question style.")(eval_command)
    app.command(
        "train-autocompressor",
        help="Turn a causal LM into an AutoCompressor (summary embeddings + LoRA).",
    )(train_autocompressor)
    app.command(
        "calibrate-heads",
        help="Find a model's retrieval heads for Finch (synthetic needles; cached per model).",
    )(calibrate_heads_command)


_register_operations()


def main() -> None:  # pragma: no cover - console entry
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
