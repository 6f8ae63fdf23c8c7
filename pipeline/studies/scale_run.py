"""A whole `longdoc run` at scale on this machine: driver memory, overhead per row, kill + rerun.

Writes N small deterministic documents (JSONL files of ``--docs-per-file`` documents, a
few hundred tokens each) and a summarize spec on ``random:tiny`` (a few M random
weights: model time is small, so what a row costs is mostly the pipeline's own work),
then runs the real CLI, ``longdoc run SPEC --date D --runner ray``, as a subprocess twice:

1. **Full run.** Wall time of the command (Python imports, embedded Ray start, model
   load included) and rows/s; the driver's peak resident memory (``VmHWM`` of
   ``/proc/<pid>/status``, the kernel's own high-water mark, read every ``--poll-s``)
   and the whole process tree's peak (driver + embedded Ray's GCS, raylet and workers:
   the sum of their ``VmRSS`` per poll, so a sampled peak); the generate actors' busy
   seconds (the rows' ``device_s``: batch wall time / rows) to separate model time
   from pipeline overhead; the steady rate between the first and the last staged block.
2. **Kill + rerun.** A fresh output folder; the same command is started, and once the
   staged files (``{out}.runs/_staging/D/{run_id}/*.staged``, one per generate batch) hold
   ``--kill-at`` of the rows, the driver's process group is SIGKILLed (an event: files
   are polled, nothing waits on a timer). Ray processes still alive afterwards are
   reported (and left running: the rerun must work beside them), then the same
   command runs again. Checked from the Parquet files: every request exactly once, no
   error, the rerun's ``skipped`` (its run record under ``{out}.runs/D/``) at least
   the rows on disk before it (more when the killed run's leftover workers staged rows
   in the meantime: ``straggler_rows``), and each of those rows still carrying the killed
   run's ``run_id`` (``redone`` counts the ones that do not: must be 0).

**Several sizes** (``--docs 10000,30000,100000``): run 1 at each size in turn, one corpus
on disk at a time, and a side-by-side table (``scale_sizes.json``/``.md``): driver peak
RSS, time to the first staged block, rows/s, each with its ratio to the smallest size,
and the flatness targets (``RSS_TARGET``, ``FIRST_BLOCK_TARGET``) checked on the largest.
Per-row generation can be made as cheap as the study needs (``--words``,
``--max-new-tokens``, ``--target-tokens``): it measures the pipeline around the engine.

Prints a Markdown table and writes ``scale_run.json`` and ``scale_run.md`` (figures,
commands, date, commit, machine) under ``--out``; the work files (corpus, spec, outputs,
logs) go under ``--out``/work unless ``--work`` says elsewhere. Linux only (``/proc``).

    OMP_NUM_THREADS=1 .venv/bin/python -m pipeline.studies.scale_run --docs 10000 --out jobs/results/scale
    OMP_NUM_THREADS=1 .venv/bin/python -m pipeline.studies.scale_run --docs 10000,30000,100000 \
        --words 20 --max-new-tokens 1 --target-tokens 16 --batch-size 64 --poll-s 1 --out jobs/results/scale
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from pipeline.host_load import cpu_name
from pipeline.studies.proc_watch import Watch, comm, descendants, end, still_alive
from stages.layout import run_record_dirs, staging_dir

DATE = "2026-01-31"
#: Words the synthetic documents are drawn from: plain English, so the real tokenizer
#: gives ~1.2 tokens per word, as it would on a prose corpus.
WORDS = (
    "the river city report council budget north south winter summer bridge harbour "
    "market station school museum library road railway ferry island valley mountain "
    "lake forest village festival season traffic weather energy water power plant "
    "hospital garden street tower castle church square park museum archive census "
    "committee minutes approved rejected increased reduced opened closed built moved "
    "during after before between across along under over because although while and "
    "of to in on for with by from at as is was were has had will would could should"
).split()
KILL_GRACE_S = 30.0  # how long the killed driver may take to be reaped


# ----------------------------------------------------------------------------- inputs
def document_text(i: int, words: int) -> str:
    """Document ``i``: ``words`` words drawn with seed ``i`` (the same text on every run)."""
    rng = random.Random(i)
    sentences, n = [], 0
    while n < words:
        k = min(rng.randint(8, 16), words - n)
        s = " ".join(rng.choice(WORDS) for _ in range(k))
        sentences.append(f"Document {i}: {s}." if not sentences else s.capitalize() + ".")
        n += k
    return " ".join(sentences)


def write_corpus(folder: Path, n_docs: int, words: int, docs_per_file: int) -> list[Path]:
    """JSONL files ``part-NNNNN.jsonl`` of ``{"id", "text"}`` lines, ``docs_per_file`` each."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for start in range(0, n_docs, docs_per_file):
        path = folder / f"part-{start // docs_per_file:05d}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i in range(start, min(start + docs_per_file, n_docs)):
                f.write(json.dumps({"id": f"doc-{i:06d}", "text": document_text(i, words)}) + "\n")
        files.append(path)
    return files


def spec_dict(corpus: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The job: summarize each document with random:tiny; resources as the sample job's
    (jobs/sample-summarize.yaml: one actor of 2 CPUs, no GPU) unless overridden."""
    resources: dict[str, Any] = {"actors": args.actors, "num_cpus": args.num_cpus, "num_gpus": 0}
    if args.batch_size is not None:
        resources["batch_size"] = args.batch_size
    return {
        "name": "scale",
        "input": {"uri": str(corpus), "format": "jsonl"},
        "task": {"kind": "summarize"},
        "compression": {"method": "truncate", "target_tokens": args.target_tokens, "keep": "head"},
        "generation": {"model": "random:tiny", "max_new_tokens": args.max_new_tokens, "temperature": 0.0},
        "resources": resources,
        "output": {"uri": "out/{job}"},  # each run sets its own with --set output.uri=...
    }


# ----------------------------------------------------------------------------- runs
def longdoc_command(spec: Path, date: str, out: Path) -> list[str]:
    exe = Path(sys.executable).with_name("longdoc")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "pipeline.cli"]
    # --runner ray: the study measures the Ray runner (its driver, GCS, raylet and workers,
    # and their leftovers after a kill); `auto` would run one actor in one process.
    return [*head, "run", str(spec), "--date", date, "--set", f"output.uri={out}", "--runner", "ray"]


def start(cmd: list[str], log: Path, ray_tmp: Path) -> subprocess.Popen:
    """The driver in a session (process group) of its own; an embedded Ray of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_TMPDIR"] = str(ray_tmp)  # every Ray file of this run under one folder
    env.setdefault("OMP_NUM_THREADS", "1")
    with log.open("w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


def rows_of(out: Path, date: str, columns: list[str]) -> list[dict]:
    """Rows written for ``date``, published and staged (the staged may repeat a published one)."""
    files = sorted((out / f"run_date={date}").glob("*.parquet")) + sorted(_staging(out, date).glob("*/*.staged"))
    return [r for f in files for r in pq.read_table(f, columns=columns).to_pylist()]


def _staging(out: Path, date: str) -> Path:
    return Path(staging_dir(str(out), date))


def run_records(out: Path, date: str) -> list[dict]:
    """The run records of ``date`` (stages/layout.py ``run_record_dirs``: beside ``out``)."""
    return [json.loads(p.read_text())["summary"]
            for d in run_record_dirs(str(out), date) for p in sorted(Path(d).glob("*.json"))]


def full_run(spec: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run 1: the whole job once, watched."""
    out = work / "full" / "out"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = longdoc_command(spec, args.date, out)
    with tempfile.TemporaryDirectory(prefix="ldscale-") as ray_tmp:  # short: Ray's socket paths
        t0 = time.monotonic()
        proc = start(cmd, work / "full" / "run.log", Path(ray_tmp))
        watch = Watch(proc.pid, _staging(out, args.date), args.poll_s, t0)
        watch.until(proc)
        wall = time.monotonic() - t0
        left = still_alive(watch.tree_procs)
        end(left)
    if proc.returncode != 0:
        raise RuntimeError(f"run 1 exited {proc.returncode}:\n{_tail(work / 'full' / 'run.log')}")
    cols = ["request_id", "error", "device_s", "e2e_s", "compress_s", "prefill_s", "decode_s", "output_tokens"]
    rows = rows_of(out, args.date, cols)
    (record,) = run_records(out, args.date)
    n = len(rows)
    busy = sum(r["device_s"] or 0.0 for r in rows)
    steady = None
    if watch.first_rows_t is not None and watch.last_rows_t and watch.last_rows_t > watch.first_rows_t:
        steady = (watch.staged_rows - watch.first_rows) / (watch.last_rows_t - watch.first_rows_t)
    return {
        "command": " ".join(cmd),
        "exit_code": proc.returncode,
        "rows": n,
        "unique_requests": len({r["request_id"] for r in rows}),
        "errors": sum(r["error"] is not None for r in rows),
        "wall_s": wall,
        "run_wall_s": record.get("wall_s"),  # from Ray up to the run record (no imports, no Ray start)
        "rows_per_s": n / wall if wall else None,
        "overhead_ms_per_row": 1000 * wall / n if n else None,
        "first_block_s": watch.first_rows_t,
        "last_block_s": watch.last_rows_t,
        "steady_rows_per_s": steady,
        "generate_busy_s": busy,
        "generate_ms_per_row": 1000 * busy / n if n else None,
        # Wall time no generate actor was busy, per row (one actor: wall - busy).
        "non_generate_ms_per_row": 1000 * (wall - busy / args.actors) / n if n else None,
        "mean_e2e_s": sum(r["e2e_s"] or 0.0 for r in rows) / n if n else None,
        "mean_output_tokens": sum(r["output_tokens"] or 0 for r in rows) / n if n else None,
        "driver_peak_rss_mb": watch.driver_hwm_kb / 1024,
        "driver_peak_anon_mb": watch.driver_anon_peak_kb / 1024,
        "driver_peak_shared_mb": watch.driver_shared_peak_kb / 1024,
        "driver_timeline": watch.driver_timeline,
        "tree_peak_rss_mb": watch.tree_peak_kb / 1024,
        "tree_max_processes": watch.tree_max_procs,
        "left_running_after_exit": len(left),
        "staged_blocks": record.get("staged_blocks"),
        "files_written": record.get("files_written"),
    }


def kill_and_rerun(spec: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run 2: kill the driver at ``--kill-at`` of the rows, then the same command again."""
    out = work / "kill" / "out"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = longdoc_command(spec, args.date, out)
    target = max(1, math.ceil(args.kill_at * args.docs))
    staging = _staging(out, args.date)
    with tempfile.TemporaryDirectory(prefix="ldscale-") as tmp_a, tempfile.TemporaryDirectory(prefix="ldscale-") as tmp_b:
        t0 = time.monotonic()
        proc = start(cmd, work / "kill" / "killed.log", Path(tmp_a))
        watch = Watch(proc.pid, staging, args.poll_s, t0)
        if not watch.until(proc, rows=target):
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before {target} rows were staged: "
                               f"nothing to kill; use more --docs\n{_tail(work / 'kill' / 'killed.log')}")
        watch.tree_procs.update(descendants(proc.pid))
        os.killpg(proc.pid, signal.SIGKILL)
        kill_s = time.monotonic() - t0
        proc.wait(timeout=KILL_GRACE_S)
        rows_at_kill = watch.staged_rows
        left_after_kill = still_alive(watch.tree_procs)
        left_names = sorted(Counter(map(comm, left_after_kill)).items())  # now: they may exit soon
        killed_run_ids = sorted(p.name for p in staging.iterdir() if p.is_dir())
        # What the rerun will find: every row on disk now (stragglers of the killed run
        # included, if any survived it).
        before = {r["request_id"]: r["run_id"] for r in rows_of(out, args.date, ["request_id", "run_id"])}
        t1 = time.monotonic()
        rerun = start(cmd, work / "kill" / "rerun.log", Path(tmp_b))
        watch2 = Watch(rerun.pid, staging, args.poll_s, t1, lingering=dict(left_after_kill))
        watch2.until(rerun)
        rerun_s = time.monotonic() - t1
        left_after_rerun = still_alive({**left_after_kill, **watch2.tree_procs})
        end(left_after_rerun)
    if rerun.returncode != 0:
        raise RuntimeError(f"the rerun exited {rerun.returncode}:\n{_tail(work / 'kill' / 'rerun.log')}")
    final = rows_of(out, args.date, ["request_id", "run_id", "error"])
    ids = [r["request_id"] for r in final]
    final_run_id = {r["request_id"]: r["run_id"] for r in final}
    # The killed run left the record it writes when it starts (status running); the rerun's own is the other.
    killed_records = [r for r in run_records(out, args.date) if r.get("run_id") in killed_run_ids]
    (record,) = [r for r in run_records(out, args.date) if r.get("run_id") not in killed_run_ids]
    kept = sum(final_run_id.get(rid) == run_id for rid, run_id in before.items())
    # Workers of the killed run that outlived it can still stage a row or two after the
    # snapshot above (seen: 6 rows in the 2.5 s they lived on). The rerun skips those too
    # when they land before its own scan; either way every request ends up once.
    killed_rows = sum(r["run_id"] in killed_run_ids for r in final)
    return {
        "command": " ".join(cmd),
        "kill_target_rows": target,
        "killed_after_s": kill_s,
        "rows_at_kill": rows_at_kill,
        "killed_run_ids": killed_run_ids,
        "killed_run_status": [r.get("status") for r in killed_records],  # its first record: "running"
        "ray_processes_left_after_kill": len(left_after_kill),
        "left_after_kill_names": left_names,
        # Seconds into the rerun when the last of them had exited by itself (None: never).
        "left_after_kill_gone_s": watch2.lingering_gone_s if left_after_kill else 0.0,
        "rows_before_rerun": len(before),
        "killed_run_rows_final": killed_rows,
        "straggler_rows": killed_rows - kept,
        "rerun_exit_code": rerun.returncode,
        "rerun_s": rerun_s,
        "rerun_run_id": record.get("run_id"),
        "rerun_skipped": record.get("skipped"),
        "rerun_rows": record.get("rows"),
        "rerun_status": record.get("status"),
        "kept_original_run_id": kept,
        "redone": len(before) - kept,
        "final_rows": len(ids),
        "final_unique_requests": len(set(ids)),
        "final_errors": sum(r["error"] is not None for r in final),
        "staged_left": len(list(staging.glob("*/*.staged"))) if staging.exists() else 0,
        "ray_processes_left_after_rerun": len(left_after_rerun),
    }


# ----------------------------------------------------------------------------- report
def machine() -> dict[str, Any]:
    model = cpu_name() or platform.processor()
    mem_kb = _status_kb_meminfo("MemTotal")
    return {"host": platform.node(), "cpu": model, "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)), "mem_gb": round(mem_kb / 2**20, 1) if mem_kb else None,
            "python": platform.python_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1")}


def _status_kb_meminfo(key: str) -> int | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(res: dict[str, Any]) -> str:
    full, kill, m = res.get("full_run"), res.get("kill_rerun"), res["machine"]
    lines = [
        f"# `longdoc run` at scale: {res['docs']} documents, random:tiny",
        "",
        f"{res['measured_at']}, commit {res['commit']}, {m['cpu']} ({m['usable_cpus']} usable of {m['cpus']} "
        f"CPUs, {m['mem_gb']} GB, OMP_NUM_THREADS={m['omp_num_threads']}), Python {m['python']}. "
        f"~{res['words_per_doc']} words a document, max_new_tokens {res['max_new_tokens']}, "
        f"batch_size {res['batch_size'] or 'default'}, {res['actors']} actor(s).",
        "",
        f"    {res['command']}",
    ]
    if full:
        lines += [
            "",
            "| run 1: whole job | value |",
            "|---|---|",
            f"| rows (unique requests, errors) | {full['rows']} ({full['unique_requests']}, {full['errors']}) |",
            f"| wall time of `longdoc run` (s) | {_f(full['wall_s'])} |",
            f"| of which the run itself, Ray up (run record `wall_s`) | {_f(full['run_wall_s'])} |",
            f"| rows/s (whole command) | {_f(full['rows_per_s'], 2)} |",
            f"| steady rows/s (first to last staged block) | {_f(full['steady_rows_per_s'], 2)} |",
            f"| wall time per row (ms) | {_f(full['overhead_ms_per_row'])} |",
            f"| generate actor busy per row (ms, rows' `device_s`) | {_f(full['generate_ms_per_row'])} |",
            f"| wall time per row outside the generate actor (ms) | {_f(full['non_generate_ms_per_row'])} |",
            f"| first block staged after (s) | {_f(full['first_block_s'])} |",
            f"| driver peak RSS (MB, VmHWM) | {_f(full['driver_peak_rss_mb'])} |",
            f"| process tree peak RSS (MB, sampled sum) | {_f(full['tree_peak_rss_mb'])} |",
            f"| processes in the tree (max) | {full['tree_max_processes']} |",
            f"| staged blocks, files published | {full['staged_blocks']}, {full['files_written']} |",
        ]
    if kill:
        lines += [
            "",
            f"| run 2: SIGKILL of the driver's process group at {res['kill_at']:.0%}, then the same command | value |",
            "|---|---|",
            f"| rows staged when killed (target) | {kill['rows_at_kill']} ({kill['kill_target_rows']}) |",
            f"| killed after (s) | {_f(kill['killed_after_s'])} |",
            f"| Ray processes alive after the kill | {kill['ray_processes_left_after_kill']} "
            f"({', '.join(f'{n} x{c}' for n, c in kill['left_after_kill_names']) or 'none'}) |",
            f"| ... all gone by themselves after (s into the rerun) | {_f(kill['left_after_kill_gone_s'])} |",
            f"| rows on disk before the rerun | {kill['rows_before_rerun']} |",
            f"| rows staged after that by the killed run's leftover workers | {kill['straggler_rows']} |",
            f"| rerun: skipped, written, status | {kill['rerun_skipped']}, {kill['rerun_rows']}, {kill['rerun_status']} |",
            f"| rows kept with the killed run's run_id | {kill['kept_original_run_id']} |",
            f"| **redone** (must be 0) | {kill['redone']} |",
            f"| final rows, unique requests, errors | {kill['final_rows']}, {kill['final_unique_requests']}, "
            f"{kill['final_errors']} |",
            f"| rerun wall time (s) | {_f(kill['rerun_s'])} |",
        ]
    return "\n".join(lines) + "\n"


#: The flatness targets of the sizes table: the largest corpus against the smallest.
RSS_TARGET = 1.3  # driver peak RSS at most this many times the smallest corpus's
FIRST_BLOCK_TARGET = 1.5  # first staged block at most this many times later


def sizes_markdown(res: dict[str, Any]) -> str:
    """The side-by-side table of ``--docs A,B,C`` (run 1 of each size), ratios to the smallest."""
    m, runs = res["machine"], res["sizes"]
    base = runs[0]["full_run"]
    lines = [
        f"# `longdoc run` at {', '.join(str(r['docs']) for r in runs)} documents: flat in the corpus size?",
        "",
        f"{res['measured_at']}, commit {res['commit']}, {m['cpu']} ({m['usable_cpus']} usable of {m['cpus']} "
        f"CPUs, {m['mem_gb']} GB, OMP_NUM_THREADS={m['omp_num_threads']}, shared with other work), "
        f"Python {m['python']}. random:tiny, ~{res['words_per_doc']} words a document, "
        f"max_new_tokens {res['max_new_tokens']} (generation kept cheap: the study measures the "
        f"pipeline around the engine), batch_size {res['batch_size'] or 'default'}, "
        f"{res['docs_per_file']} documents per JSONL file, {res['actors']} actor(s), runner ray. "
        + res.get("note", "The sizes ran one after the other in one invocation."),
        "",
        *(f"    {c}" for c in res["command"].split("\n")),
        "",
        "| documents | " + " | ".join(str(r["docs"]) for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]

    def row(label: str, key: str, digits: int = 1, ratio: bool = False) -> str:
        cells = []
        for r in runs:
            v = r["full_run"].get(key)  # a size measured before the figure existed: -
            cell = _f(v, digits)
            if ratio and r is not runs[0] and v is not None and base.get(key):
                cell += f" ({v / base[key]:.2f}x)"
            cells.append(cell)
        return f"| {label} | " + " | ".join(cells) + " |"

    lines += [
        row("rows", "rows", 0),
        row("driver peak RSS (MB, VmHWM)", "driver_peak_rss_mb", ratio=True),
        row("  its own heap at peak (MB, RssAnon)", "driver_peak_anon_mb", ratio=True),
        row("  mapped files and shared memory at peak (MB, RssFile + RssShmem)", "driver_peak_shared_mb", ratio=True),
        row("first block staged after (s)", "first_block_s", ratio=True),
        row("rows/s (whole command)", "rows_per_s", 2, ratio=True),
        row("steady rows/s (first to last staged block)", "steady_rows_per_s", 2, ratio=True),
        row("wall time of `longdoc run` (s)", "wall_s"),
        row("process tree peak RSS (MB, sampled sum)", "tree_peak_rss_mb", ratio=True),
        row("staged blocks", "staged_blocks", 0),
        row("errors", "errors", 0),
    ]
    top = runs[-1]["full_run"]
    rss = top["driver_peak_rss_mb"] / base["driver_peak_rss_mb"]
    first = (top["first_block_s"] or 0) / base["first_block_s"] if base["first_block_s"] else None
    lines += [
        "",
        f"Targets ({runs[-1]['docs']} against {runs[0]['docs']} documents): driver peak RSS "
        f"{rss:.2f}x (target <= {RSS_TARGET}x: {'PASS' if rss <= RSS_TARGET else 'FAIL'}); first "
        f"staged block {_f(first, 2)}x (target <= {FIRST_BLOCK_TARGET}x: "
        f"{'PASS' if first is not None and first <= FIRST_BLOCK_TARGET else 'FAIL'}).",
    ]
    return "\n".join(lines) + "\n"


def sizes_main(sizes: list[int], args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Run 1 at each corpus size in turn (one corpus at a time on disk) and write the
    side-by-side table (``scale_sizes.json``/``.md`` under ``--out``)."""
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    res: dict[str, Any] = {
        "words_per_doc": args.words, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "docs_per_file": args.docs_per_file, "actors": args.actors, "date": args.date,
        "command": " ".join([Path(sys.executable).name, "-m", "pipeline.studies.scale_run",
                             *(argv if argv is not None else sys.argv[1:])]),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(), "machine": machine(), "sizes": [],
    }
    for n in sizes:
        args.docs = n
        size_work = work / f"docs-{n}"
        shutil.rmtree(work, ignore_errors=True)  # one corpus and its outputs on disk at a time
        corpus = size_work / "corpus"
        write_corpus(corpus, n, args.words, args.docs_per_file)
        spec = size_work / "scale.yaml"
        spec.write_text(yaml.safe_dump(spec_dict(corpus, args), sort_keys=False))
        res["sizes"].append({"docs": n, "full_run": full_run(spec, size_work, args)})
        print(f"{n} documents: {json.dumps(res['sizes'][-1]['full_run'])}", flush=True)
        (out / "scale_sizes.json").write_text(json.dumps(res, indent=2) + "\n")  # each size as it lands
    shutil.rmtree(work, ignore_errors=True)
    text = sizes_markdown(res)
    print(text)
    (out / "scale_sizes.md").write_text(text)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", default="10000", help="documents (one request each); several sizes "
                    "A,B,C: run 1 at each, side by side (scale_sizes.md)")
    ap.add_argument("--out", required=True, help="folder for scale_run.json and scale_run.md")
    ap.add_argument("--work", default=None, help="corpus, spec, outputs and logs (default: OUT/work)")
    ap.add_argument("--date", default=DATE, help="the run date of both runs")
    ap.add_argument("--words", type=int, default=250, help="words a document (~1.2 tokens each)")
    ap.add_argument("--docs-per-file", type=int, default=1000, help="documents per input JSONL file")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--target-tokens", type=int, default=256, help="truncate budget")
    ap.add_argument("--batch-size", type=int, default=None, help="resources.batch_size (default: the spec's)")
    ap.add_argument("--actors", type=int, default=1)
    ap.add_argument("--num-cpus", type=float, default=2, help="CPUs per generate actor (the sample job's 2)")
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction of the rows staged when the driver is killed")
    ap.add_argument("--runs", default="full,kill", help="which runs: full (run 1), kill (run 2), or both")
    ap.add_argument("--poll-s", type=float, default=0.2, help="seconds between polls of /proc and the staged files")
    args = ap.parse_args(argv)
    try:
        sizes = [int(n) for n in str(args.docs).split(",")]
    except ValueError:
        ap.error(f"--docs {args.docs!r}: a number of documents, or several: 10000,30000,100000")
    if len(sizes) > 1:
        if min(sizes) < 2 or sizes != sorted(sizes):
            ap.error("--docs A,B,C: increasing sizes of at least 2")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return sizes_main(sizes, args, argv)
    args.docs = sizes[0]
    runs = set(args.runs.split(","))
    if args.docs < 2 or not 0.0 < args.kill_at < 1.0 or not runs or runs - {"full", "kill"}:
        ap.error("--docs must be >= 2, --kill-at in (0, 1), --runs one or both of full,kill")
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    write_corpus(corpus, args.docs, args.words, args.docs_per_file)
    spec = work / "scale.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(corpus, args), sort_keys=False))
    res: dict[str, Any] = {
        "docs": args.docs, "words_per_doc": args.words, "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size, "actors": args.actors, "kill_at": args.kill_at, "date": args.date,
        "command": " ".join([Path(sys.executable).name, "-m", "pipeline.studies.scale_run",
                             *(argv if argv is not None else sys.argv[1:])]),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(), "machine": machine(),
    }
    if "full" in runs:
        res["full_run"] = full_run(spec, work, args)
    if "kill" in runs:
        res["kill_rerun"] = kill_and_rerun(spec, work, args)
    text = markdown(res)
    print(text)
    (out / "scale_run.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "scale_run.md").write_text(text)
    return res


if __name__ == "__main__":
    main()
