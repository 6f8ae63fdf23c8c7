"""Ray's console kept quiet on a healthy run, every real error still shown.

Contract:
- ``MODEL_STACK_ENV``: the model stack's console settings for the processes that load
  models (Ray's workers, pipeline/placement.py ``init_ray``; this process under the local
  runner).
- ``quiet_python_loggers()``, ``quiet_issue_detectors(ctx)`` and ``quiet_native_stderr()``
  turn Ray's console chatter off for a healthy run while keeping every Ray log file
  complete and every real error on stderr (see their docstrings);
  ``quiet_worker_tracebacks()`` shows a failing Ray worker's traceback as one line (the
  run's own abort line names the cause: schemas/output.py ``error_cause``).
- ``LONGDOC_RAY_LOGS=1`` (``longdoc run --verbose``) leaves Ray's output untouched.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any, TextIO

from pipeline.progress import CONSOLE
from schemas.output import raised_last

#: The model stack's console settings for the processes that load models (Ray's workers,
#: pipeline/placement.py ``init_ray``; this process under the local runner): no download
#: bars, tokenizer fork notices or transformers notices between progress lines.
MODEL_STACK_ENV = {"TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
RAY_LOGS_ENV = "LONGDOC_RAY_LOGS"


# Lines Ray prints on every healthy run that say nothing actionable. Each is matched by
# a fragment of its fixed text, so any other line (a real error) still gets through.
HARMLESS_NATIVE_LINES = (
    # Ray core (C++, once per process, ERROR level) whenever an actor with restarts
    # gets constructor arguments by reference. Ray Data always passes its map
    # transformer and DataContext that way (ray-project/ray#53727). Harmless here: the
    # driver holds those references for the whole execution, so a restarted actor
    # finds them; if the driver's node is lost, the run is lost anyway.
    "has constructor arguments in the object store and max_restarts > 0",
)
HARMLESS_PY_MESSAGES = (
    "Progress bars disabled.",  # we turned them off ourselves: RunProgress replaces them
    "Token authentication is enabled for this Ray cluster.",  # local Ray: secure default
    # Ray Data's preface to a failed stage's traceback, which the console no longer shows
    # (_NoTraceback): it blames Ray's code for what the run's abort line names.
    "Exception occurred in Ray Data or Ray Core internal code.",
    "Full stack trace:",
)


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(msg.startswith(m) for m in HARMLESS_PY_MESSAGES)


def ray_logs_wanted() -> bool:
    return os.environ.get(RAY_LOGS_ENV, "").strip().lower() in ("1", "true", "yes")


def quiet_python_loggers() -> None:
    """Ray's Python loggers: INFO chatter off the console, known-harmless warnings dropped.

    Call before ``ray.init``. Only console handlers change: Ray Data's ``ray-data.log``
    handler and Ray's session log files keep every record.
    """
    if ray_logs_wanted():
        return
    import ray.data  # noqa: F401  (configures the ray.data logger and its handlers)
    from ray.util.debug import log_once

    # Ray's one-time hint after its first "[repeated Nx across cluster]" line (how to turn
    # deduplication off, and a URL) counts as shown; the deduplication itself stays on.
    log_once("log_dedup_warning")

    drop = _DropHarmless()
    for name in ("ray", "ray.data", "ray._private.authentication.authentication_token_setup"):
        lg = logging.getLogger(name)
        if drop not in lg.filters and not any(isinstance(f, _DropHarmless) for f in lg.filters):
            lg.addFilter(drop)
        for h in lg.handlers:
            # Ray Data's console handler prints INFO ("Starting execution of Dataset",
            # "Execution plan ...", "execution finished") on every run.
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                if h.level < logging.WARNING:
                    h.setLevel(logging.WARNING)
                if not any(isinstance(f, _DropHarmless) for f in h.filters):
                    h.addFilter(drop)
                if not isinstance(h.formatter, _NoTraceback):
                    # Ray Data logs a failed actor's traceback with its error: one line here,
                    # whole in ray-data.log (the file handler keeps its own formatter).
                    h.setFormatter(_NoTraceback(h.formatter))


class _NoTraceback(logging.Formatter):
    """A console formatter that prints a record without its traceback (``inner`` formats the
    rest); the record itself is left as it was, for the other handlers."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def quiet_issue_detectors(ctx: Any) -> None:
    """Turn off Ray Data's issue detectors on ``ctx`` (a DataContext) unless Ray's logs are wanted.

    Its high-memory detector warns, every 30 s of a run and in ten lines each time, that the
    generate actors use a few GiB while Ray reserved none for them. That is by design: an
    actor holds its model and KV cache, actors are placed by CPU/GPU, and on Kubernetes each
    pod's memory comes from ``longdoc render --worker-memory``. On a long CPU run the
    repeated warning buried the progress line. LONGDOC_RAY_LOGS=1 (--verbose) keeps them.
    Ray versions without issue detectors are left as they are.
    """
    if ray_logs_wanted():
        return
    config = getattr(ctx, "issue_detectors_config", None)
    if config is not None and hasattr(config, "detectors"):
        config.detectors = []


class NativeStderrFilter:
    """Drop known-harmless lines that native code writes straight to file descriptor 2.

    Ray's C++ core logs errors to fd 2 directly (and to its own log file, which keeps
    them), so no Python logging setting reaches them. Between ``start()`` and ``stop()``
    fd 2 is a pipe read by a thread that forwards every line to the real stderr except
    lines containing one of ``patterns``. Python's ``sys.stderr`` is pointed at the
    real stderr directly, so the progress line and tracebacks never wait on the pipe.
    Start it only after ``ray.init`` has spawned its processes (they must not inherit
    the pipe); ``stop()`` restores fd 2 only if it still is our pipe (pytest or another
    tool may have swapped it meanwhile) and is registered with ``atexit``.
    """

    def __init__(self, patterns: tuple[str, ...] = HARMLESS_NATIVE_LINES, fd: int = 2) -> None:
        self.patterns = tuple(p.encode() for p in patterns)
        self.fd = fd
        self._saved: int | None = None
        self._pipe_ino: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._old_sys_stderr: TextIO | None = None
        self.dropped = 0

    def start(self) -> None:
        assert self._saved is None, "filter already started"
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError):
            pass
        self._saved = os.dup(self.fd)
        r, w = os.pipe()
        os.dup2(w, self.fd)
        os.close(w)
        st = os.fstat(self.fd)
        self._pipe_ino = (st.st_dev, st.st_ino)
        if self.fd == 2 and getattr(sys.stderr, "fileno", None) is not None:
            try:
                is_fd2 = sys.stderr.fileno() == 2
            except (OSError, ValueError):
                is_fd2 = False
            if is_fd2:  # Python writes bypass the pipe: same terminal, no delay
                self._old_sys_stderr = sys.stderr
                sys.stderr = os.fdopen(os.dup(self._saved), "w", buffering=1, errors="backslashreplace")
                CONSOLE.stream = sys.stderr
        self._thread = threading.Thread(target=self._pump, args=(r,), name="longdoc-stderr", daemon=True)
        self._thread.start()

    def _pump(self, r: int) -> None:
        out = self._saved
        assert out is not None
        pending = b""
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._forward(out, line + b"\n")
        if pending:
            self._forward(out, pending)

    def _forward(self, out: int, line: bytes) -> None:
        if any(p in line for p in self.patterns):
            self.dropped += 1
            return
        with CONSOLE.lock:
            if CONSOLE.active is not None and CONSOLE.active.tty:
                os.write(out, b"\r\x1b[K")  # the progress line is redrawn at its next update
            os.write(out, line)

    def stop(self) -> None:
        if self._saved is None:
            return
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino) == self._pipe_ino:
            os.dup2(self._saved, self.fd)  # closes the pipe's last write end: the pump ends
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._old_sys_stderr is not None:
            sys.stderr.flush()
            sys.stderr = self._old_sys_stderr
            CONSOLE.stream = None
        os.close(self._saved)
        self._saved = None


_native_filter: NativeStderrFilter | None = None


def quiet_native_stderr() -> None:
    """Start the process-wide native stderr filter once (after ``ray.init``)."""
    global _native_filter
    if ray_logs_wanted() or _native_filter is not None:
        return
    import atexit

    _native_filter = NativeStderrFilter()
    _native_filter.start()
    atexit.register(_native_filter.stop)


# A line that goes on quoting a traceback the raylet started (blank, indented, an exception,
# the chaining sentences between two tracebacks).
_QUOTE_GOES_ON = re.compile(
    r"^(\s|$|Traceback \(|During handling of the above|The above exception|ray::"
    r"|(?:[A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt|Warning)\b)")
# A worker's Python traceback or native crash report, as Ray forwards its lines to the driver.
_TRACEBACK_START = re.compile(
    r"Traceback \(most recent call last\)|Exception raised in creation task|logging\.cc:\d+: Stack trace"
    r"|\*\*\* SIGABRT received|The actor died because of an error")


def _say(line: str) -> None:
    """One line on the console, clearing the progress line first (it is redrawn at its next update)."""
    stream = CONSOLE.stream or sys.stderr
    with CONSOLE.lock:
        if CONSOLE.active is not None and CONSOLE.active.tty:
            stream.write("\r\x1b[K")
        stream.write(line + "\n")
        stream.flush()


class WorkerTracebackFilter:
    """Wraps Ray's handler of the lines its workers write (``emit(data)``: ``data`` has
    ``pid``, ``is_err`` and ``lines``) so that a worker's traceback does not reach the
    console: from a worker's first traceback line on, its stderr lines are dropped for the
    rest of the run (the worker is failing, and its failure is the run's abort line or its
    rows' ``error``; workers are told apart by host and pid, so a later worker given the
    same pid stays quiet too: the Ray session's logs keep every line), and
    one line says once where the full text is. Its other lines pass as they were. A failing
    actor's creation printed ~400 lines of tracebacks, Ray's and the C++ core's, before the
    run's one-line cause."""

    def __init__(self, emit, say=None) -> None:
        self.emit = emit
        self.say = say or _say
        self.failing: set[Any] = set()  # workers that printed a traceback
        self.quoting: set[Any] = set()  # Ray's own processes quoting a traceback now
        self.dropped = 0

    def __call__(self, data: dict) -> None:
        key = (data.get("ip"), data.get("pid"))
        # Ray's own processes (the raylet, on either stream) go on after quoting a task's
        # traceback: only the quote's lines go, over as many batches as it takes.
        worker = isinstance(key[1], int) or str(key[1]).isdigit()
        if worker and not data.get("is_err"):
            self.emit(data)
            return
        kept = []
        for line in data.get("lines") or []:
            if key in self.quoting and not _QUOTE_GOES_ON.match(line):
                self.quoting.discard(key)
            if key not in self.failing and key not in self.quoting and _TRACEBACK_START.search(line):
                if not self.dropped:
                    self.say("  (a Ray worker failed; its traceback is in the Ray session's logs, "
                             "or shown with `longdoc run --verbose`)")
                (self.failing if worker else self.quoting).add(key)
            if key in self.failing or key in self.quoting:
                self.dropped += 1
            else:
                kept.append(line)
        if kept:
            self.emit({**data, "lines": kept})


def shorten_quoted_tracebacks(data: dict) -> dict:
    """``data`` (a batch Ray prints) with each line that quotes a whole traceback (the
    raylet's "Task ... failed ... Error: Traceback ...", one multi-line string) cut to its
    head and the exception it ends in."""
    lines = []
    for line in data.get("lines") or []:
        head, sep, rest = line.partition("Traceback (most recent call last):")
        if sep and "\n" in rest:
            line = f"{head.rstrip()} {raised_last(rest) or ''}".rstrip()
        lines.append(line)
    return {**data, "lines": lines}


def quiet_worker_tracebacks() -> None:
    """Put ``WorkerTracebackFilter`` around Ray's worker-log printer and shorten the task
    errors Ray's error listener prints (``shorten_quoted_tracebacks``), after ``ray.init``,
    unless Ray's logs are wanted. Nothing is changed where this Ray has no such printers."""
    if ray_logs_wanted():
        return
    try:
        import ray._private.worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    with dispatcher._lock:
        handlers = dispatcher.handlers
        dispatcher.handlers = [(name, h if name != "ray_print_logs" or isinstance(h, WorkerTracebackFilter)
                                else WorkerTracebackFilter(h)) for name, h in handlers]
    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is not None and not getattr(printer, "longdoc_shortened", False):
        # The error listener thread looks the printer up by name at each error.
        def shortened(data, *args, **kwargs):
            return printer(shorten_quoted_tracebacks(data), *args, **kwargs)

        shortened.longdoc_shortened = True
        ray_worker.print_to_stdstream = shortened
