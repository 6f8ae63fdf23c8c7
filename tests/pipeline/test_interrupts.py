"""A real signal mid-run (pipeline/cli.py, pipeline/runner.py): the run stops cleanly.

`longdoc run` is started as a user starts it (a child process); SIGINT lands at its first
staged block, then a second run of the same date is stopped by SIGTERM while it decodes,
then a third run finishes. Each interrupted run exits 130 / 143 (no SIGABRT, no
traceback), keeps its staged rows and writes a run record saying ``interrupted``; the
last run publishes everything: every request exactly once, no error row.
Both runners: local (in this process) and Ray (embedded; slow: Ray's start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.report.load import staged_rows
from pipeline.runner import _interrupts_held
from stages.layout import run_record_path, staging_dir

LONGDOC = str(Path(sys.executable).parent / "longdoc")
DATE = "2026-01-01"
DOCS = 48  # enough that a signal sent at the first staged block lands mid-run
#: The longest a child may take to stage a block or to stop (a loaded 2-core machine).
WAIT_S = 300
# Tokens decoded per row, and the engine's slots: with 48 tokens a quiet machine finished
# the rest of a run between the test's polls of the staged folder (random weights read from
# the cache start fast); with every row in the engine at once they all finish in the same
# step as the first staged block (a Zen 5 core, 2026-11-29). Two slots: 24 waves of rows,
# so the signal lands while 23 are still to decode.
NEW_TOKENS = 256
SLOTS = 2


def _job(tmp_path: Path) -> Path:
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(DOCS):
            text = " ".join(f"Sentence {j} of document {i} says something." for j in range(40))
            f.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "intr", "input": {"uri": str(tmp_path / "docs.jsonl"), "format": "jsonl"},
        "generation": {"model": "random:tiny", "max_new_tokens": NEW_TOKENS},
        "resources": {"batch_size": 2, "decode_slots": SLOTS}, "output": {"uri": str(tmp_path / "out")},
    }))
    return spec


def _staged(out: Path) -> set[Path]:
    return set(Path(staging_dir(str(out), DATE)).rglob("*.staged"))


def _run(spec: Path, runner: str, sig: signal.Signals | None) -> tuple[int, str]:
    """Run once; with ``sig``, send it when a block this run staged appears."""
    out = spec.parent / "out"
    before = _staged(out)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.Popen([LONGDOC, "run", str(spec), "--date", DATE, "--runner", runner],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**env, "OMP_NUM_THREADS": "1"}, cwd=spec.parent)
    if sig is not None:
        t0 = time.time()
        while not (_staged(out) - before) and p.poll() is None and time.time() - t0 < WAIT_S:
            time.sleep(0.1)
        assert p.poll() is None, "the run ended before it could be interrupted"
        p.send_signal(sig)
    text, _ = p.communicate(timeout=WAIT_S)
    return p.returncode, text


def _record(spec: Path, text: str) -> dict:
    run_id = text.split("longdoc: run ", 1)[1].split()[0]
    return json.loads(Path(run_record_path(str(spec.parent / "out"), DATE, run_id)).read_text())["summary"]


def _interrupt_then_finish(tmp_path: Path, runner: str) -> None:
    spec = _job(tmp_path)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        rc, text = _run(spec, runner, sig)
        assert rc == code, f"{sig.name}: exit {rc}\n{text[-3000:]}"
        assert "Traceback" not in text and "terminate called" not in text, text[-3000:]
        assert f"interrupted ({sig.name})" in text and "run the same date again" in text
        summary = _record(spec, text)
        assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig.name
        # Its record counts every row it staged (Ray's last blocks too, not yet handed over).
        assert summary["rows"] == staged_rows(str(tmp_path / "out"), DATE, summary["run_id"]) > 0, summary
    assert _staged(tmp_path / "out"), "the interrupted runs' staged rows were kept"
    rc, text = _run(spec, runner, None)
    assert rc == 0, text[-3000:]
    assert _record(spec, text)["status"] == "succeeded"
    assert not _staged(tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / f"run_date={DATE}")
    ids = table.column("request_id").to_pylist()
    assert len(ids) == DOCS and len(set(ids)) == DOCS, "every request exactly once"
    assert sorted(table.column("doc_id").to_pylist()) == sorted(f"d{i}" for i in range(DOCS))
    assert table.column("error").null_count == DOCS, "no error row"


@pytest.mark.slow  # three model loads: ~2 min on the loaded 2-core machine
def test_interrupts_on_the_local_runner_lose_nothing(tmp_path):
    _interrupt_then_finish(tmp_path, "local")


@pytest.mark.slow
def test_interrupts_on_the_ray_runner_lose_nothing(tmp_path):
    _interrupt_then_finish(tmp_path, "ray")


@pytest.mark.slow  # two model loads
def test_a_driver_killed_without_a_word_is_named_by_its_first_record(tmp_path):
    """A driver that cannot write its record (Ray ends it when its head node dies; here
    SIGKILL) left nothing `report` could name. Its first record says it started; the next
    run of the date publishes its staged rows and records its own end, and `report` then
    says the first ended unrecorded."""
    spec = _job(tmp_path)
    rc, text = _run(spec, "local", signal.SIGKILL)
    assert rc == -signal.SIGKILL
    killed = text.split("longdoc: run ", 1)[1].split()[0]
    assert _record(spec, text)["status"] == "running"
    report = subprocess.run([LONGDOC, "report", str(tmp_path / "out")], capture_output=True, text=True, timeout=WAIT_S)
    # Its lease names a process that has ended: the driver is gone, not running.
    assert report.returncode == 0 and f"({killed})" in report.stdout and "ended unrecorded" in report.stdout
    assert "run the date again to finish it" in report.stdout, report.stdout
    rc, text = _run(spec, "local", None)
    assert rc == 0 and _record(spec, text)["status"] == "succeeded", text[-3000:]
    report = subprocess.run([LONGDOC, "report", str(tmp_path / "out")], capture_output=True, text=True, timeout=WAIT_S)
    assert "ended unrecorded" in report.stdout and "went on with the date" in report.stdout, report.stdout
    ids = pq.read_table(tmp_path / "out" / f"run_date={DATE}").column("request_id").to_pylist()
    assert len(ids) == DOCS and len(set(ids)) == DOCS, "every request exactly once"


def test_an_interrupt_between_the_last_row_and_the_record_is_noted_not_raised():
    """pipeline/runner.py ``_interrupts_held``: a real SIGINT inside the block is noted (the
    runner records the run as interrupted); a second goes to the handler it replaced; after
    the block that handler is back."""
    seen: list[int] = []

    def previous(signum, _frame):
        seen.append(signum)

    restore = signal.signal(signal.SIGINT, previous)
    try:
        with _interrupts_held() as arrived:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs at the next bytecode of the main thread
            assert arrived == [signal.SIGINT] and seen == []
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is previous
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert seen == [signal.SIGINT, signal.SIGINT] and len(arrived) == 2
    finally:
        signal.signal(signal.SIGINT, restore)
