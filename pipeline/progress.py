"""What `longdoc run` prints while it runs: one progress line.

Contract:
- ``estimate_requests(spec, n_shards, skipped)`` returns the number of rows the run
  will write when the file listing alone tells it (text corpora: one document per
  file; questions per document not from the data), else None. It never reads the
  input: the runner learns the total of a JSONL or Parquet corpus from the read
  stage's ledger once every file is read (``ledger_total``; stages/ledger.py).
  Requests already written (``skipped``) are subtracted.
- ``RunProgress`` takes cumulative counts after every batch and prints
  ``rows done[/total] | elapsed | ETA | failed | tok/s | rows/s[ | activity]``. The ETA
  appears once rows are written. Where the engine's work is known (``engine``: rows
  finished and decoding, their tokens, the share of time spent prefilling; the local
  runner's engine, or the Ray runner's generate engines summed, as their actors report
  them to pipeline/engine_board.py) it counts the work done, not the rows written: the
  rows the engine finished (a batch is written only once its last row is done), and each decoding row
  as its prefill done (the engine's prefill share of a row) plus its decoding so far (its
  tokens of the finished rows' mean); the rate runs from when the engine was made
  (reading and the model load before it are no row's work). Rows written alone
  undercount the work early on: the engine fills its ~48-68 slots before the first rows
  finish and writes them in batches, so the ETA of a long local night ran ~2x high for
  its first minutes (jobs/results/usability/2026-12-07-evening/soak.md; before and after
  on a real run: jobs/results/usability/2026-12-07-night/eta-and-gpu-refusal.md); a
  synthetic fill-first timeline (tests/pipeline/test_progress.py) holds this one within
  0.85-1.15x of the truth over the first 40% of the rows, where the rate of rows written
  since the first ones (below) runs high.
  Without it (a Ray run before the engines' first report, or without its board) it
  comes from the rate since the first rows were written, from the second count on: the
  time before the first rows (Ray's start, model loads, the engine filling its slots)
  says nothing about that rate, and a small job whose rows all decode together finishes
  them in one burst (a rate from the start predicted 29 min for the last 18 s of
  the sample job). On a terminal, rich draws it as one live line: a bar of rows/total
  (pulsing while the total is unknown) and that text, cut to the terminal's width (a
  wrapped line could not be redrawn in place). Otherwise (cluster job logs) a plain line
  at most every ``interval_s`` seconds, plus a final line from ``close()``. Without a
  total it prints rows done and no ETA.

Ray's own console output is kept quiet by pipeline/ray_console.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from schemas.spec import JobSpec

DEFAULT_INTERVAL_S = 30.0  # one log line per half minute keeps cluster logs short
BAR_WIDTH = 24  # the terminal's bar; the text after it gets the rest of the width


# ----------------------------------------------------------------------------- totals
def estimate_requests(spec: JobSpec, n_shards: int, skipped: int = 0) -> int | None:
    """Rows this run will write, or None when only the read stage can tell (see above)."""
    inp = spec.input
    if inp.format != "text":
        return None  # documents per file live in the data: the ledger tells, once read
    if spec.task.kind == "summarize":
        per_doc = 1
    else:
        per_doc = max(1, len(spec.task.questions))  # a qa doc without questions: 1 error row
    docs = n_shards if inp.limit is None else min(n_shards, inp.limit)
    return max(docs * per_doc - skipped, 0)


def ledger_total(requests: Iterable[dict[str, Any]], skip: frozenset[str]) -> int:
    """Rows a run writes: its requests (``Ledger.iter_requests``) not already done, each once;
    only their ids are held."""
    return len({r["request_id"] for r in requests} - skip)


# ----------------------------------------------------------------------------- ticks
@contextlib.contextmanager
def ticking(on_wait: Callable[[], None] | None, tick_s: float) -> Iterator[None]:
    """Call ``on_wait`` now and every ``tick_s`` seconds from a daemon thread while the
    block runs (a blocking read, a model load or Ray's iteration, which cannot call it
    itself). ``on_wait`` only draws the line: an error in it (a storage hiccup while it
    looks at the ledger) is said once and the ticks go on; the block's own work never
    fails for it, and leaving the block waits at most a second for a tick in hand."""
    if on_wait is None:
        yield
        return
    done = threading.Event()
    said: list[BaseException] = []

    def safe() -> None:
        try:
            on_wait()
        except Exception as e:  # noqa: BLE001 - the progress line must not end the run
            if not said:
                said.append(e)
                print(f"note: the progress line could not update ({type(e).__name__}: {e}); the run goes on",
                      file=sys.stderr, flush=True)

    def tick() -> None:
        while not done.wait(tick_s):
            safe()

    safe()
    thread = threading.Thread(target=tick, name="longdoc-progress-tick", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)  # a daemon: one still inside a slow look ends with the process


# ----------------------------------------------------------------------------- the line
def _duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class RunProgress:
    """Progress of one run; feed it cumulative counts, it decides when to print.

    ``stream`` defaults to the console (stderr, or the real terminal behind
    ``quiet_native_stderr``'s filter); ``tty`` defaults to whether that stream is a terminal;
    ``clock`` is injectable so tests need no sleeping.
    """

    def __init__(
        self,
        total: int | None,
        enabled: bool = True,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.enabled, self.clock = total, enabled, clock
        self.stream = stream if stream is not None else console_stream()
        self.tty = _isatty(self.stream) if tty is None else tty
        self.interval_s = interval_s if interval_s is not None else _interval_from_env()
        self.t0 = clock()
        self._last_print: float | None = None
        self._live: Live | None = None  # the terminal's live line, from the first draw to close()
        self._printed_rows = -1
        self._printed_phase = ""  # the activity's head (before any ':') at the last plain line
        self._first_rows: tuple[float, int] | None = None  # (when, how many) rows were first written
        self.rows = self.failed = self.tokens = 0
        # What the run is doing between written rows (the engine(s); "" = nothing to say).
        self.activity: Callable[[], str] | None = None
        # The engine's work: (rows finished, their output tokens, rows decoding, their tokens
        # so far, its share of time spent prefilling), None while there is no engine (or no
        # report of one) yet; or no callable: not known. Looked at on every update and tick (``_look``).
        self.engine: Callable[[], tuple[int, int, int, int, float] | None] | None = None
        self._engine_from: float | None = None  # when ``engine`` first answered: the engine's start
        self._work: tuple[int, int, int, int, float] | None = None  # its last answer; None: none now

    @classmethod
    def for_run(cls, spec: JobSpec, n_shards: int, skipped: int, enabled: bool = True) -> RunProgress:
        """A progress line for a run, with the total when the file listing tells it."""
        return cls(estimate_requests(spec, n_shards, skipped) if enabled else None, enabled=enabled)

    def line(self) -> str:
        el = max(self.clock() - self.t0, 1e-9)
        total = self.total if self.total is not None and self.rows <= self.total else None
        done = f"rows {self.rows}" if total is None else (
            f"rows {self.rows}/{total} ({self.rows / total:.0%})" if total else "rows 0/0")
        rate = self.rows / el
        # The time figures first: an 80-column terminal cuts the line's end (a trial never
        # saw its ETA there), and the rates matter least.
        parts = [done, f"elapsed {_duration(el)}"]
        eta = self._eta_s(total)
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        parts += [f"failed {self.failed}", f"{self.tokens / el:.1f} tok/s", f"{rate:.2f} rows/s"]
        activity = self.activity  # read once: the run's end clears it from another thread
        doing = activity() if activity is not None else ""
        if doing:
            parts.append(doing)
        return " | ".join(parts)

    def _eta_s(self, total: int | None) -> float | None:
        """Seconds left (None: not known yet): with the engine at hand, at the rate of the work
        done since it was made, the rows finished plus the work in hand (``_done``); else at the
        rate since the first rows were written."""
        if total is None or not 0 < self.rows < total or self._first_rows is None:
            return None
        work = self._work  # read once: the tick thread may set it meanwhile
        if self._engine_from is not None and work is not None:
            done = self._done(work)
            el = self.clock() - self._engine_from
            return max(total - done, 0.0) * el / done if el > 0 else None
        since, first = self._first_rows
        el = self.clock() - since
        # A window of at least half the time the first rows took: rows finish in waves (the
        # engine's slots), and a shorter window measures the spread within one wave, not the
        # rate (an eval's 30th row came 20 s after its 10th, 8 minutes in: "ETA 45s" for 50
        # rows that took 13 more minutes).
        if self.rows <= first or el <= 0 or el < (since - self.t0) / 2:
            return None
        return (total - self.rows) * el / (self.rows - first)

    def _done(self, work: tuple[int, int, int, int, float]) -> float:
        """Rows' worth of work done: the rows the engine finished (at least the rows written:
        some never reach it, e.g. a document's error row), and each decoding row as its
        prefill (the engine's share of time spent prefilling: a row's share in a steady
        engine) plus the rest of a row in the proportion its tokens are of the finished
        rows' mean (at most one row each). Rows queued count nothing."""
        finished, finished_tokens, decoding, tokens, prefill_share = work
        if not finished or not finished_tokens:
            return float(max(self.rows, finished))
        share = min(max(prefill_share, 0.0), 1.0)
        decoded = min(float(decoding), tokens * finished / finished_tokens)  # rows' worth of tokens
        return max(self.rows, finished) + share * decoding + (1.0 - share) * decoded

    def _look(self) -> None:
        """The engine's work now (``engine``), and when it was first there."""
        engine = self.engine  # read once: the run's end sets it to None from another thread
        if engine is None:
            return
        # None: no engine now (not made yet; a Ray board lost, or every report stale): the ETA
        # goes back to the rows-written rate rather than count a gone engine's old rows at a
        # falling rate; when it answers again, its rate runs from its first answer, as before.
        work = engine()
        self._work = work
        if work is not None and self._engine_from is None:
            self._engine_from = self.clock()

    def update(self, rows: int, failed: int, tokens: int) -> None:
        """Cumulative rows written, failed rows among them, output tokens so far."""
        self.rows, self.failed, self.tokens = rows, failed, tokens
        if self._first_rows is None and rows > 0:
            self._first_rows = (self.clock(), rows)
        self._refresh()

    def _refresh(self) -> None:
        """Print or redraw the line for the counts held (``update``'s and ``tick``'s)."""
        now = self.clock()
        if not self.enabled:
            return
        # Every update and tick, printed or not: the engine's start is known to the tick.
        self._look()
        if self.tty:
            self._draw(self.line())
        elif self._last_print is None or now - self._last_print >= self.interval_s or self._new_phase():
            self._emit(self.line())
            self._last_print = now

    def _phase(self) -> str:
        activity = self.activity  # read once, as in line()
        doing = activity() if activity is not None else ""
        # "engine" and "3 engines" are one phase: an actor more (or a report gone stale and
        # back) is not a new phase to print a line for.
        return re.sub(r"^\d+ engines$", "engine", doing.split(":", 1)[0])

    def _new_phase(self) -> bool:
        """Before the first rows, a plain line as soon as the run moves on to another phase
        (reading the first file -> loading the model -> the engine): a log read later shows
        what a long wait was (a trial's log said "reading the first input file" for the
        whole of a 69 s model load)."""
        return self._first_rows is None and self._phase() != self._printed_phase

    def tick(self) -> None:
        """The same counts again: while nothing is written, the line's elapsed time and
        activity still move (redrawn on a terminal, else one line per interval). Safe from
        another thread than ``update``'s: it never writes the counts back."""
        self._refresh()

    def close(self) -> None:
        """Print the final state (ends the redrawn line on a terminal)."""
        if not self.enabled:
            return
        if self.tty:
            self._draw(self.line(), last=True)
            self._live = None
            CONSOLE.active = None
        elif self._last_print is None or self.rows != self._printed_rows:
            self._emit(self.line())

    def frame(self, text: str) -> Table:
        """The terminal's line: a bar of rows/total (pulsing without a total) and ``text``,
        one row that never wraps (rich redraws one line in place; see ``_draw``)."""
        row = Table.grid(padding=(0, 1))
        row.add_column(width=BAR_WIDTH)
        row.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        total = self.total if self.total is not None and self.rows <= self.total else None
        bar = ProgressBar(total=total, completed=self.rows, width=BAR_WIDTH, pulse=total is None,
                          animation_time=self.clock())
        row.add_row(bar, Text(text, no_wrap=True, overflow="ellipsis"))
        return row

    def _draw(self, text: str, last: bool = False) -> None:
        """Redraw the live line (``last``: for the final time, ending its line). Refreshed
        here only, never by rich's timer thread: the counts move with ``update``/``tick``,
        and the console lock orders every frame with the native stderr lines
        ``NativeStderrFilter`` forwards (which clear the line first)."""
        with CONSOLE.lock:
            if self._live is None:
                # sys.stdout/stderr are left alone: the stderr filter owns them (Ray's lines).
                console = Console(file=self.stream, force_terminal=True, highlight=False)
                self._live = Live(console=console, auto_refresh=False, redirect_stdout=False,
                                  redirect_stderr=False, transient=False)
                self._live.start()
            self._live.update(self.frame(text), refresh=not last)
            if last:
                self._live.stop()  # draws the frame, ends its line, shows the cursor again
        CONSOLE.active = self

    def _emit(self, text: str) -> None:
        with CONSOLE.lock:
            self.stream.write("  " + text + "\n")
            self.stream.flush()
        self._printed_rows, self._printed_phase = self.rows, self._phase()


def _interval_from_env() -> float:
    raw = os.environ.get("LONGDOC_PROGRESS_INTERVAL_S", "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"LONGDOC_PROGRESS_INTERVAL_S={raw!r}; allowed: a number of seconds > 0")
    return value


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ----------------------------------------------------------------------------- the console
class _Console:
    """The real stderr behind the filter, and the progress line drawn on it (if any)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stream: TextIO | None = None
        self.active: RunProgress | None = None


#: The one console of this process: pipeline/ray_console.py's stderr filter writes through it
#: and clears the progress line first.
CONSOLE = _Console()


def console_stream() -> TextIO:
    return CONSOLE.stream if CONSOLE.stream is not None else sys.stderr
