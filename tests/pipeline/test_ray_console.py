"""pipeline/ray_console.py: Ray's console chatter off, every real error kept."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.ray_console import (
    HARMLESS_NATIVE_LINES,
    NativeStderrFilter,
    WorkerTracebackFilter,
    _DropHarmless,
    quiet_issue_detectors,
)

ROOT = Path(__file__).resolve().parents[2]


def test_native_filter_drops_only_known_harmless_lines(tmp_path):
    """A child process writes to fd 2 like Ray's C++ core does; only the known line goes."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.ray_console import NativeStderrFilter
        f = NativeStderrFilter()
        f.start()
        os.write(2, b"[E core_worker.cc:1] Actor X {HARMLESS_NATIVE_LINES[0]}. See ...\\n")
        os.write(2, b"[E core_worker.cc:2] Failed to register actor: real trouble\\n")
        os.write(2, b"partial line without newline")
        print("python stderr line", file=sys.stderr)
        f.stop()
        os.write(2, ("dropped=%d\\n" % f.dropped).encode())
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "LONGDOC_RAY_LOGS": ""})
    assert r.returncode == 0, r.stderr
    assert HARMLESS_NATIVE_LINES[0] not in r.stderr
    assert "Failed to register actor: real trouble" in r.stderr
    assert "partial line without newline" in r.stderr and "python stderr line" in r.stderr
    assert r.stderr.rstrip().endswith("dropped=1")


def test_filter_stop_leaves_a_swapped_fd_alone(tmp_path):
    """If someone else (pytest, a tool) replaced fd 2 after start, stop must not undo it."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.ray_console import NativeStderrFilter
        f = NativeStderrFilter()
        f.start()
        other = os.open({str(tmp_path / "other.log")!r}, os.O_WRONLY | os.O_CREAT)
        os.dup2(other, 2)
        f.stop()
        os.write(2, b"still to other\\n")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "other.log").read_text() == "still to other\n"


@pytest.mark.parametrize(("msg", "kept"), [
    ("Progress bars disabled. To enable, set ...", False),
    ("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled ...", False),
    ("Token authentication is disabled for this Ray cluster. Anyone with network access ...", True),
    ("Ray's object store is configured to use only 29.6% of available memory", True),
])
def test_python_filter_keeps_everything_but_the_known_messages(msg, kept):
    rec = logging.LogRecord("ray.data", logging.WARNING, "x.py", 1, msg, None, None)
    assert _DropHarmless().filter(rec) is kept


def test_filter_is_not_started_twice():
    fd = os.dup(2)
    f = NativeStderrFilter(fd=fd)
    try:
        f.start()
        with pytest.raises(AssertionError):
            f.start()
    finally:
        f.stop()
        os.close(fd)


@pytest.mark.parametrize(("ray_logs", "silenced"), [(None, True), ("1", False)])
def test_issue_detectors_off_unless_ray_logs_are_wanted(monkeypatch, ray_logs, silenced):
    from ray.data import DataContext

    monkeypatch.delenv("LONGDOC_RAY_LOGS", raising=False)
    if ray_logs:
        monkeypatch.setenv("LONGDOC_RAY_LOGS", ray_logs)
    ctx = DataContext()  # a fresh context, not the process-wide one
    before = list(ctx.issue_detectors_config.detectors)
    assert before, "Ray Data ships issue detectors; this test needs one to switch off"
    quiet_issue_detectors(ctx)
    assert ctx.issue_detectors_config.detectors == ([] if silenced else before)


def test_a_failing_workers_traceback_is_one_line_and_its_other_lines_pass():
    """A failing actor's creation printed ~400 lines of tracebacks (Python's, Ray's and the
    C++ core's) before the run's one-line cause; a worker's ordinary lines still pass."""
    shown, said = [], []
    f = WorkerTracebackFilter(shown.append, said.append)
    f({"pid": 7, "ip": "h", "is_err": False, "lines": ["an ordinary print"]})
    f({"pid": 7, "ip": "h", "is_err": True, "lines": ["a warning before", "Traceback (most recent call last):",
                                                     '  File "x.py", line 1', "ValueError: bad"]})
    f({"pid": 7, "ip": "h", "is_err": True, "lines": ["logging.cc:125: Stack trace:", "  /lib/ray.so(+0x1)"]})
    f({"pid": 8, "ip": "h", "is_err": True, "lines": ["another worker's warning"]})
    f({"pid": 8, "ip": "h", "is_err": True, "lines": ["Exception raised in creation task: The actor died", "more"]})
    # The raylet quotes a task's traceback, over several batches, and goes on.
    f({"pid": "raylet", "ip": "h", "is_err": False, "lines": ["Task failed. Error: Traceback (most recent call last):",
                                                            '  File "y.py"']})
    f({"pid": "raylet", "ip": "h", "is_err": True, "lines": ["", "KeyError: 'x'", "During handling of the above",
                                                            "ray.exceptions.ActorDiedError: died", "    ^^^",
                                                            "ray::MapWorker(MapBatches(GenerateStage)).__init__()",
                                                            "Exception: boom", "KeyboardInterrupt"]})
    f({"pid": "raylet", "ip": "h", "is_err": True, "lines": ["the node is low on memory"]})
    lines = [ln for d in shown for ln in d["lines"]]
    assert lines == ["an ordinary print", "a warning before", "another worker's warning", "the node is low on memory"]
    assert len(said) == 1 and "longdoc run --verbose" in said[0]
    assert f.dropped == 17


def test_a_ray_data_error_reaches_the_console_without_its_traceback_and_the_record_keeps_it():
    import io

    from pipeline.ray_console import _NoTraceback

    console, kept = logging.StreamHandler(io.StringIO()), []
    console.setFormatter(_NoTraceback(logging.Formatter("%(levelname)s %(message)s")))
    try:
        raise KeyError("added_tokens")
    except KeyError:
        import sys as _sys

        record = logging.LogRecord("ray.data", logging.ERROR, "x.py", 1, "an actor failed", None, _sys.exc_info())
    console.emit(record)
    kept.append(logging.Formatter().format(record))  # another handler: the traceback is still there
    assert console.stream.getvalue() == "ERROR an actor failed\n"
    assert "Traceback (most recent call last)" in kept[0] and "added_tokens" in kept[0]


def test_a_task_error_quoting_a_traceback_is_cut_to_its_head_and_its_exception():
    from pipeline.ray_console import shorten_quoted_tracebacks

    quoted = ("Task X.get_location failed. There are 2 retries remaining. Error: Traceback (most recent call last):\n"
              '\n  File "a.py", line 1\n\nKeyError: \'added_tokens\'\n\nDuring handling of the above exception\n'
              "Traceback (most recent call last):\n  File \"b.py\"\nray.exceptions.ActorDiedError: The actor died\n"
              "  File \"c.py\"\nKeyError: 'added_tokens'\n")
    out = shorten_quoted_tracebacks({"pid": "raylet", "lines": [quoted, "an ordinary line"]})
    assert out["lines"] == ["Task X.get_location failed. There are 2 retries remaining. Error: KeyError: 'added_tokens'",
                            "an ordinary line"]
