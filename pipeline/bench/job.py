"""`longdoc bench job SPEC`: the whole job, longdoc against the script a user would write instead.

What it runs, in ONE invocation, on the same documents and model:
- the longdoc side: the spec end to end exactly as a user runs it, in a fresh process
  (read, tokenize, compression, the decode engine, Parquet write and commit) into an
  output folder of its own under a temporary directory: ``--runner ray`` runs
  ``longdoc run --runner ray``; ``--runner local`` the same stages in one process
  without Ray (pipeline/bench/inprocess.py: `longdoc run --runner local` plus the
  engine's own figures); ``auto`` (default) what `longdoc run` picks on one machine
  (local for one generate actor, Ray for a pool), local where Ray is not installed
  (GPU benchmark machines). ``--variant NAME:k=v;k=v``
  (repeatable) runs several longdoc sides, each the spec with those overrides (e.g.
  compression methods none vs finch vs rag); an override ``env.NAME=value`` sets an
  environment variable of that side's process instead (e.g. ``env.OMP_NUM_THREADS=1``),
  for settings of the machine rather than of the job, and ``runner=ray|local|auto`` that
  side's runner instead of ``--runner`` (``--variant ray:runner=ray --variant
  local:runner=local`` compares the two runners in one run);
- the peer: pipeline/bench/peer.py in a fresh process, the plain-transformers script a
  user would write (same documents, chat template, instruction and truncation where a
  user could do it in a few lines: ``truncate`` -> the same head/tail cut; every other
  method -> the whole document, as a user without longdoc has no Finch or RAG in a few
  lines; batched greedy ``generate`` with left padding, static cache + compile on CUDA;
  Parquet out), at its BEST batch size: every ``--peer-batch-sizes`` candidate is
  timed on the first documents in a probe process of its own, then the timed runs use
  the fastest.

The sides alternate ``--runs`` times (longdoc sides, then peers, then again), so noise on
a shared machine hits all of them; the summary is the median of each figure. Every
side is measured as a whole process (pipeline/bench/job_measure.py) and at its steady
state; figures, ratios and targets are defined in pipeline/bench/job_report.py.
Results: JSON + Markdown under ``--out`` (default jobs/results/bench-job/), named by
device, spec and model, with the command line, git commit, versions and settings.

Refused before anything heavy starts (exit 2, one line naming the option or field and
what is allowed): a missing or invalid spec, a bad ``--set``/``--variant``, ``--runs``
< 1, bad ``--peer-batch-sizes``, ``--synthetic-docs`` without ``--doc-tokens``, a
variant that changes the input, output or model (all sides read the same documents
with the same model), sampling (``generation.temperature`` > 0: the comparison is
greedy), an unknown ``--runner`` or ``--sides``.

``--synthetic-docs N --doc-tokens T`` replaces the spec's input with N documents of
exactly T tokens cut from jobs/corpus (pipeline/bench/job_docs.py), written as a JSONL
corpus in the temporary directory: the GPU night is
``--model random:llama-8b --synthetic-docs 1000 --doc-tokens 8192`` with variants
none / finch-1k / rag-1k (infra/README.md, "GPU night").

Where: the options and their checks in pipeline/bench/job_settings.py; what every side
reads and one run of each side in pipeline/bench/job_sides.py; here the bench that
alternates them, the agreement of their answers and the result record; figures, ratios,
targets and the files in pipeline/bench/job_report.py.

This module's import chain needs typer, pyyaml, pyarrow, psutil, pydantic (schemas)
and, when it runs, torch and transformers; never Ray (the longdoc side imports it in
its own process, when the runner is ray).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.bench.job_report import (
    DEFAULT_OUT,
    finish,
    summary_lines,
    write_results,
)
from pipeline.bench.job_settings import (
    JobBenchSettings,
    Variant,
    check_settings,
    command_line,
    parse_sizes,
    parse_variant,
)
from pipeline.bench.job_sides import (
    ROOT,
    Prepared,
    dtype_label,
    engines,
    prepare,
    probe_peer,
    run_longdoc,
    run_peer,
    runner_name,
)
from pipeline.choices import Runner
from pipeline.host_load import cpu_identity, cpu_label

Opt = Optional  # noqa: UP045 - typer needs Optional


def agreement(p: Prepared, variant: str, rows: list[dict], peer_rows: list[dict] | None) -> dict:
    """Rows with the peer's output text, where both read the same context."""
    peer = p.peer_of.get(variant)
    if peer is None or peer_rows is None:
        return {"peer": peer, "reason": "no peer run"}
    method = p.methods[variant]
    if not p.same_context[variant]:
        return {"peer": peer, "reason": f"{method} reads another context than the peer (the whole document)"}
    theirs = {r["request_id"]: r for r in peer_rows}
    pairs = [(r, theirs[r["request_id"]]) for r in rows if r["error"] is None and r["request_id"] in theirs]
    # A stop rule the peer lacks (generation.repeat_guard, stop strings) ends a longdoc
    # row early: its text is then the start of the peer's, which is agreement up to that
    # stop ("prefix"), not a different decoding ("differs").
    verdicts = ["equal" if a["output_text"] == b["output_text"] else "prefix" if _cut_short(a, b) else "differs"
                for a, b in pairs]
    return {"peer": peer, "dtype": p.dtype, "compared": len(pairs),
            "text_equal": verdicts.count("equal"),
            "text_prefix": verdicts.count("prefix"),
            "prompt_tokens_equal": sum(a["prompt_tokens"] == b["prompt_tokens"] for a, b in pairs),
            "differs": [a["doc_id"] for v, (a, _) in zip(verdicts, pairs, strict=True) if v == "differs"][:20]}


def side_agreement(first: list[dict], other: list[dict]) -> dict:
    """Rows of another longdoc side with the first side's output text (same request ids):
    variants that must not change answers (a scheduling switch) are checked here."""
    def key(r: dict) -> tuple:  # request ids differ when the settings do: match the request itself
        return (r["doc_id"], r["prompt"])  # the prompt holds the question: a document's rows apart

    theirs = {key(r): r for r in first}
    pairs = [(r, theirs[key(r)]) for r in other if r["error"] is None and key(r) in theirs]
    return {"compared": len(pairs), "text_equal": sum(a["output_text"] == b["output_text"] for a, b in pairs),
            "differs": [a["doc_id"] for a, b in pairs if a["output_text"] != b["output_text"]][:20]}


def _cut_short(ours: dict, peer: dict) -> bool:
    """Our row stopped earlier than the peer's and its text is where the peer's begins."""
    a, b = ours["output_text"] or "", peer["output_text"] or ""
    return bool(a.strip()) and ours["output_tokens"] < peer["output_tokens"] and b.startswith(a.rstrip())
# ----------------------------------------------------------------------------- the bench
@functools.cache
def _git() -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"longdoc_commit": git("rev-parse", "HEAD"), "dirty": bool(dirty) if dirty is not None else None}


def _versions() -> dict:
    from pipeline.report.summary import package_versions

    v = package_versions()
    return {**v, "psutil": _version("psutil")}


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _notes(s: JobBenchSettings, p: Prepared) -> list[str]:
    notes = [
        "wall = the side's whole process, start to exit (interpreter, imports, Ray start, model load, warm-up, "
        "every document, Parquet write); steady = first document started to last written.",
        "longdoc steady state (ray runner): the earliest row start (a staged block's write time minus its rows' "
        "e2e_s, blocks dated while the run goes) to the last block written (the last progress line); "
        "inprocess runner: its own stamps (first batch's tokenization began, last batch staged).",
        "peer: pipeline/bench/peer.py (imports only torch, transformers, pyarrow): the chat template around "
        "'Document:\\n<text>\\n\\n<instruction>', the same prompt token ids as longdoc's; truncate -> the same "
        "head/tail cut; any other method -> the whole document; batched greedy generate, left padding, rows stop "
        "at EOS; static cache + compile on CUDA (one warm-up call, outside its steady state, inside its wall time); "
        "per-document latency = its batch's generate time.",
        "The peer's batch size is the fastest candidate of a probe on the first documents (own process, not "
        "counted in any timed run).",
        "peak RSS sums the process tree (shared pages once per process: Ray's object store counts several "
        "times); PSS divides shared pages among processes.",
        f"Runs alternate: every longdoc side, then every peer, {s.runs} time(s); the tables give medians.",
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} in the bench's environment; the peer on CPU "
        f"uses {p.threads} torch thread(s), the generate actor resources.num_cpus.",
    ]
    if p.bad_docs:
        notes.append(f"{p.bad_docs} document(s) failed to read: longdoc writes them as error rows, the peer skips them.")
    if s.synthetic_docs:
        notes.append(f"Synthetic documents: windows of {s.synthetic_source} of exactly {s.doc_tokens} tokens "
                     "(decoded and re-encoded until exact); windows overlap when the corpus is smaller than "
                     "documents x tokens.")
    return notes


def _stop_on_sigterm():
    """SIGTERM (e.g. ``timeout``) unwinds like Ctrl-C, so a running side is stopped with its
    tree; returns a function that puts the previous handler back."""
    import signal
    import threading

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _runs_at(method: str) -> str | None:
    """Where a compression method reads (stages/compression: "tokenize", "text_stage" or
    "prefill", the engine's own prefill): the report's time line says whether its reading is
    part of the engine's prefill."""
    from stages.compression import registry

    m = registry().get(method)
    return m.runs_at if m is not None else None


def _result(s: JobBenchSettings, p: Prepared, probes: dict[str, dict], runs_by_side: dict[str, list[dict]],
            last_rows: dict[str, list[dict]], load_start: tuple[float, ...], created: str, model: str, usd: float,
            partial: bool) -> dict:
    """The result record of the runs so far (``partial``: some sides or runs not yet measured)."""
    from pipeline.bench.job_report import LAYOUT_VERSION, medians

    longdoc_sides = [n for n in runs_by_side if n in p.methods]
    run_peers = [n for n in runs_by_side if n in p.peers]
    sides = {name: {"kind": "longdoc", "what": f"longdoc ({runner_name(s, name, p.specs[name])}), "
                    f"compression {p.methods[name]}, speculation {p.speculative[name]}",
                    "method": p.methods[name], "method_runs_at": _runs_at(p.methods[name]),
                    "speculative": p.speculative[name], "peer": p.peer_of[name],
                    "overrides": list(next(v.overrides for v in s.variants if v.name == name)),
                    "engines": engines(s, name, p.specs[name])}
             for name in longdoc_sides}
    sides.update({peer: {"kind": "peer", "what": p.peers[peer]["what"], "batch_size": probes[peer]["best"]}
                  for peer in run_peers})
    return {
        "bench": "job", "layout_version": LAYOUT_VERSION, "command": s.command, "created_utc": created,
        **({"partial": "cut short: these sides (and runs) only"} if partial else {}),
        "versions": {**_git(), **_versions()},
        "device": {"type": p.device_type, "name": p.device_name,
                   "file_name": "cpu" if p.on_host else p.device_name},
        "host": {"cpus": os.cpu_count(), "cpu": cpu_identity(), "load_avg_start": [round(x, 2) for x in load_start],
                 "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"spec": s.spec, "spec_name": p.spec_name, "set": list(s.overrides),
                     "variants": {v.name: list(v.overrides) for v in s.variants}, "model": model,
                     "dtype": p.dtype, **({"side_dtypes": p.side_dtypes} if p.side_dtypes else {}),
                     "docs": p.requests, "docs_label": p.docs_label,
                     "max_new_tokens": p.max_new_tokens, "runs": s.runs,
                     "runner": ",".join(sorted({runner_name(s, n, p.specs[n]) for n in longdoc_sides})) or "-",
                     "peer_batch_sizes": list(s.peer_batch_sizes), "probe_docs": s.probe_docs,
                     "synthetic_docs": s.synthetic_docs, "doc_tokens": s.doc_tokens, "usd_per_device_hour": usd,
                     "date": s.date, "sides": list(s.sides), "peer_threads": p.threads},
        "sides": sides,
        "peer_probe": probes,
        "runs_by_side": runs_by_side,
        "summary": {side: medians(runs) for side, runs in runs_by_side.items()},
        "agreement": {name: agreement(p, name, last_rows[name], last_rows.get(p.peer_of[name] or ""))
                      for name in longdoc_sides if p.peer_of.get(name) in run_peers},
        "agreement_sides": {name: side_agreement(last_rows[longdoc_sides[0]], last_rows[name])
                            for name in longdoc_sides[1:] if name in last_rows and longdoc_sides[0] in last_rows},
        "notes": _notes(s, p),
    }


def run_bench(s: JobBenchSettings, echo=print) -> tuple[dict, Path, Path]:
    """Run the bench (see the module docstring); returns (result, JSON path, Markdown path)."""
    specs = check_settings(s)
    restore = _stop_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="longdoc-bench-job-"))
    ok = False
    try:
        load_start = os.getloadavg()
        _git()  # the commit measured is the one at the start (the tree may move during a long bench)
        p = prepare(s, specs, tmp)
        first_spec = specs[0]
        usd = s.usd_per_device_hour if s.usd_per_device_hour is not None else first_spec.cost.usd_per_device_hour
        cpu = cpu_label(cpu_identity()) if p.on_host else None
        echo(f"# bench job: {p.docs_label}; device {p.device_name}{f' ({cpu})' if cpu else ''}; "
             f"dtype {dtype_label(p)}; temp {tmp}")
        probes: dict[str, dict] = {}
        run_peers = list(p.peers) if "peer" in s.sides else []
        for peer in run_peers:
            probes[peer] = probe_peer(s, p, peer)
            if probes[peer].get("note") and probes[peer]["candidates"]:
                echo(f"# {peer} probe: {probes[peer]['note']}")
            for c in probes[peer]["candidates"]:
                echo(f"# {peer} probe: batch {c['batch_size']}: "
                     + (f"{c['docs_per_s']:.3f} docs/s" if c.get("status") == "ok" else c.get("status", "?")))
            echo(f"# {peer}: batch size {probes[peer]['best']}")
        runs_by_side: dict[str, list[dict]] = {}
        last_rows: dict[str, list[dict]] = {}
        longdoc_sides = [v.name for v in s.variants] if "longdoc" in s.sides else []
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")

        def write(partial: bool) -> tuple[Path, Path, dict]:
            # After every side, not only at the end: a run cut short (a device call's time
            # limit, a crash in a later side) keeps the sides it finished, marked partial.
            result = _result(s, p, probes, runs_by_side, last_rows, load_start, created,
                             first_spec.generation.model, usd, partial)
            finish(result)
            return write_results(result, s.out, s.merge)

        for k in range(1, s.runs + 1):
            for name in longdoc_sides:
                fig, rows = run_longdoc(s, p, name, k, usd)
                runs_by_side.setdefault(name, []).append(fig)
                last_rows[name] = rows
                echo(f"# run {k} {name}: wall {fig['wall_s']:.1f} s, steady {fig['steady_s'] or 0:.1f} s, "
                     f"{fig['docs']} docs, {fig['failed']} failed"
                     + (f" (first error: {fig['first_error'][:300]})" if fig["first_error"] else ""))
                write(partial=True)
            for peer in run_peers:
                fig, rows = run_peer(s, p, peer, k, probes[peer]["best"], usd)
                runs_by_side.setdefault(peer, []).append(fig)
                last_rows[peer] = rows
                echo(f"# run {k} {peer}: wall {fig['wall_s']:.1f} s, steady {fig['steady_s'] or 0:.1f} s, "
                     f"{fig['docs']} docs")
                write(partial=True)
        js, md, result = write(partial=False)
        for line in summary_lines(result):
            echo(line)
        echo(f"# results: {js} and {md}")
        ok = True
        return result, js, md
    finally:
        restore()
        if ok and not s.keep_temp:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            echo(f"# kept {tmp} (logs of each side) after the failure")
# ----------------------------------------------------------------------------- the command
def bench_job_command(
    spec: Annotated[str, typer.Argument(help="Path of the YAML job spec.")],
    set_: Annotated[Opt[list[str]], typer.Option("--set", help="Override a spec field for every side (repeatable).")] = None,  # noqa: E501
    variant: Annotated[Opt[list[str]], typer.Option(help="A longdoc side: 'NAME:key=value;key=value' (repeatable; default one side, 'longdoc'); env.NAME=value sets an environment variable of its process, runner=ray|local|auto its runner.")] = None,  # noqa: E501
    docs: Annotated[Opt[int], typer.Option(help="Only the first N documents (input.limit).")] = None,
    peer_batch_sizes: Annotated[str, typer.Option(help="Candidate batch sizes of the peer; the fastest on the first documents is timed.")] = "1,4,8,16",  # noqa: E501
    probe_docs: Annotated[Opt[int], typer.Option(help="Documents each peer candidate is timed on (default: the largest candidate).")] = None,  # noqa: E501
    runs: Annotated[int, typer.Option(help="A/B runs of every side; medians reported.")] = 2,
    out: Annotated[str, typer.Option(help="Results folder.")] = DEFAULT_OUT,
    model: Annotated[Opt[str], typer.Option(help="generation.model for every side (e.g. random:llama-8b).")] = None,
    synthetic_docs: Annotated[Opt[int], typer.Option(help="Replace the input with N synthetic documents (with --doc-tokens).")] = None,  # noqa: E501
    doc_tokens: Annotated[Opt[int], typer.Option(help="Tokens of each synthetic document, exactly.")] = None,
    synthetic_source: Annotated[str, typer.Option(help="Text the synthetic documents are cut from.")] = "jobs/corpus",
    usd_per_device_hour: Annotated[Opt[float], typer.Option(help="Price of a device hour (default: the spec's cost.usd_per_device_hour).")] = None,  # noqa: E501
    runner: Annotated[Runner, typer.Option(help="longdoc side: ray (`longdoc run --runner ray`), local (`longdoc run --runner local`, with the engine's figures), auto (what `longdoc run` picks: local for one generate actor).")] = Runner.auto,  # noqa: E501
    sides: Annotated[str, typer.Option(help="Which sides run: longdoc,peer (with --merge, a side measured in another command joins the table).")] = "longdoc,peer",  # noqa: E501
    merge: Annotated[bool, typer.Option(help="Keep an earlier file's sides that this run does not measure (same device and settings).")] = False,  # noqa: E501
    keep_temp: Annotated[bool, typer.Option(help="Keep the temporary folder (each side's spec, output and log).")] = False,  # noqa: E501
    date: Annotated[Opt[str], typer.Option(help="Run date of the longdoc side (default: today, UTC).")] = None,
) -> None:
    """The whole job end to end vs a plain-transformers script, side by side (documents/hour, $/1k docs)."""
    try:
        sizes = parse_sizes(peer_batch_sizes)
        variants = tuple(parse_variant(v) for v in variant) if variant else (Variant("longdoc"),)
        if date is not None:
            from schemas.loading import check_run_date

            check_run_date(date)
        s = JobBenchSettings(
            spec=spec, overrides=tuple(set_ or ()), variants=variants, docs=docs, peer_batch_sizes=sizes,
            probe_docs=probe_docs, runs=runs, out=out, model=model, synthetic_docs=synthetic_docs,
            doc_tokens=doc_tokens, synthetic_source=synthetic_source, usd_per_device_hour=usd_per_device_hour,
            runner=Runner(runner).value, sides=tuple(x.strip() for x in sides.split(",") if x.strip()), merge=merge,
            keep_temp=keep_temp, **({"date": date} if date else {}),
        )
        s.command = command_line(s)
        check_settings(s)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        result, _, _ = run_bench(s, echo=typer.echo)
    except (RuntimeError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    if any(t["pass"] is False for t in result["targets"]):
        typer.echo("# a target is not met (see the FAIL line above)")


if __name__ == "__main__":
    typer.run(bench_job_command)
