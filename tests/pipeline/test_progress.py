"""The run's progress line, its cheap totals, and the filter that keeps Ray quiet."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from pipeline.progress import RunProgress, estimate_requests, ledger_total
from schemas.loading import spec_from_dict

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_non_tty_prints_a_line_per_interval_and_a_final_line():
    out, clock = io.StringIO(), Clock()
    p = RunProgress(10, stream=out, tty=False, interval_s=30, clock=clock)
    clock.t += 10
    p.update(2, 0, 40)  # first update prints at once
    clock.t += 10
    p.update(4, 1, 80)  # 10 s later: within the interval, silent
    clock.t += 25
    p.update(6, 1, 120)  # 35 s after the last line: prints
    clock.t += 5
    p.update(10, 2, 200)
    p.close()  # final state not printed yet: close prints it
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    assert lines[0].strip() == "rows 2/10 (20%) | elapsed 10s | failed 0 | 4.0 tok/s | 0.20 rows/s"  # no rate yet
    assert lines[1].strip().startswith("rows 6/10 (60%) | elapsed 45s | ETA 35s | failed 1")
    assert lines[1].strip().startswith("rows 6/10 (60%) | elapsed 45s | ETA 35s")  # 4 rows left at the 4 rows per 35 s since the first ones
    assert "rows 10/10 (100%) | elapsed 50s | failed 2" in lines[2] and "ETA" not in lines[2]


def test_between_written_rows_a_tick_shows_elapsed_time_and_the_activity():
    out, clock = io.StringIO(), Clock()
    p = RunProgress(4, stream=out, tty=False, interval_s=30, clock=clock)
    doing = ["engine: 2 decoding (17 tokens), 1 prefilling, 1 queued"]
    p.activity = lambda: doing[0]
    clock.t += 31
    p.tick()  # nothing written yet: the line still moves, once per interval
    clock.t += 10
    p.tick()
    doing[0] = ""  # nothing to say: no empty field
    clock.t += 30
    p.tick()
    lines = [ln.strip() for ln in out.getvalue().splitlines()]
    assert lines == ["rows 0/4 (0%) | elapsed 31s | failed 0 | 0.0 tok/s | 0.00 rows/s | "
                     "engine: 2 decoding (17 tokens), 1 prefilling, 1 queued",
                     "rows 0/4 (0%) | elapsed 1m11s | failed 0 | 0.0 tok/s | 0.00 rows/s"]


def test_before_the_first_rows_a_new_phase_prints_at_once():
    """A log read later says what a long wait was: a trial's log showed "reading the first
    input file" for the whole of a 69 s model load (the next line was an interval away)."""
    out, clock = io.StringIO(), Clock()
    p = RunProgress(4, stream=out, tty=False, interval_s=30, clock=clock)
    doing = ["reading the first input file"]
    p.activity = lambda: doing[0]
    p.tick()
    clock.t += 1
    doing[0] = "loading the model"
    p.tick()  # another phase: at once
    clock.t += 1
    p.tick()  # the same phase: an interval away
    doing[0] = "engine: 1 prefilling"
    p.tick()
    doing[0] = "engine: 1 decoding (3 tokens)"
    p.tick()  # the engine's counts move: the same phase
    p.update(1, 0, 3)
    doing[0] = ""
    p.tick()  # after the first rows, one line per interval whatever the activity
    phases = [ln.strip().rsplit(" | ", 1)[-1] for ln in out.getvalue().splitlines()]
    assert phases == ["reading the first input file", "loading the model", "engine: 1 prefilling"]


def test_close_does_not_repeat_a_line_already_printed():
    out, clock = io.StringIO(), Clock()
    p = RunProgress(None, stream=out, tty=False, interval_s=30, clock=clock)
    clock.t += 3
    p.update(3, 0, 30)
    p.close()
    (line,) = out.getvalue().splitlines()
    assert line.strip().startswith("rows 3 | elapsed 3s | failed 0") and "ETA" not in line  # no total: no ETA


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _frames(text: str) -> list[str]:
    """The frames rich drew on the terminal: each starts at the line's start (carriage
    return, then the line erased), styles removed."""
    return [_ANSI.sub("", f) for f in text.rstrip("\n").split("\r")]


def test_tty_redraws_one_line_with_a_bar_and_the_counts(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # rich's width for a stream that is no terminal
    out, clock = io.StringIO(), Clock()
    p = RunProgress(1000, stream=out, tty=True, clock=clock)
    for i in range(1, 4):
        clock.t += 60
        p.update(i * 100, 0, i * 1000)
    p.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n\x1b[?25h")  # one line, ended by close (cursor back)
    frames = _frames(text)
    assert len(frames) == 4  # one per update, and the last from close
    assert "rows 100/1000 (10%)" in frames[0] and "ETA" not in frames[0]
    assert "rows 200/1000 (20%)" in frames[1] and "ETA 8m00s" in frames[1]  # 800 left at 100/min
    assert "rows 300/1000 (30%)" in frames[-1] and "elapsed 3m00s" in frames[-1]
    assert all(f.lstrip().startswith("━") for f in frames)  # the bar of rows/total comes first


def test_tty_line_is_cut_to_the_terminal_width_never_wrapped(monkeypatch):
    """A wrapped line cannot be redrawn in place: the text is cut, with an ellipsis."""
    monkeypatch.setenv("COLUMNS", "60")
    out, clock = io.StringIO(), Clock()
    p = RunProgress(10, stream=out, tty=True, clock=clock)
    p.activity = lambda: "engine: 2 decoding (17 tokens), 1 compressing, 3 queued"
    clock.t += 1
    p.update(1, 0, 5)
    p.close()
    frames = _frames(out.getvalue())
    assert all(len(f.rstrip()) <= 60 and "\n" not in f.rstrip() for f in frames)
    assert frames[0].rstrip().endswith("…") and "rows 1/10 (10%)" in frames[0]


def test_tty_shows_activity_before_the_first_rows_with_a_pulsing_bar(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out, clock = io.StringIO(), Clock()
    p = RunProgress(None, stream=out, tty=True, clock=clock)  # the total is not known yet
    p.activity = lambda: "engine: 4 compressing"
    clock.t += 5
    p.tick()
    p.activity = None
    p.close()
    frames = _frames(out.getvalue())
    assert "rows 0 | elapsed 5s | failed 0" in frames[0] and frames[0].rstrip().endswith("0.00 rows/s | engine: 4 compressing")
    assert "ETA" not in frames[-1] and "engine" not in frames[-1]


def test_no_eta_from_the_time_before_the_first_rows():
    # The sample job's shape: every row decodes at once, the first 3 are written after
    # 148 s (Ray, the model, 39 prefills), the other 36 18 s later. A rate from the start
    # said "ETA 29m33s" at 3/39; there is no rate to tell until rows are written twice.
    out, clock = io.StringIO(), Clock()
    p = RunProgress(39, stream=out, tty=False, interval_s=1, clock=clock)
    clock.t += 148
    p.update(3, 0, 192)
    clock.t += 18
    p.update(39, 0, 2200)
    first, last = out.getvalue().splitlines()
    assert "ETA" not in first and "ETA" not in last
    # A longer job: the ETA follows the rate since the first rows, not the start-up.
    p = RunProgress(1000, stream=out, tty=False, interval_s=1, clock=clock)
    clock.t += 120
    p.update(50, 0, 0)
    clock.t += 20
    p.update(70, 0, 0)  # a window shorter than half the first rows' time: a wave's spread, no rate
    assert "ETA" not in out.getvalue().splitlines()[-1]
    clock.t += 40
    p.update(110, 0, 0)
    assert out.getvalue().splitlines()[-1].strip().startswith("rows 110/1000 (11%) | elapsed 3m00s | ETA 14m50s")  # 890 left at 60 rows a minute


def _fill_first_night(n: int = 400, slots: int = 48, batch: int = 16, load_s: float = 20.0,
                      prefill_s: float = 0.3, step_s: float = 0.2) -> tuple[list[tuple[float, float, int]], list[float]]:
    """A synthetic timeline of the local runner's engine (no model, no clock): it prefills
    rows one at a time while a slot is free, before the next decode step ("fill first"),
    and steps every decoding row one token; most rows run to max_new_tokens (32), so rows
    finish in waves, and a batch of ``batch`` rows is written once its last row finishes.
    Returns each row's (prefill end, finish, tokens) and each batch's write time."""
    lengths = [32 if i % 5 < 3 else 12 + (7 * i) % 21 for i in range(n)]
    t, nxt, active = load_s, 0, {}
    rows: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * n
    while nxt < n or active:
        if nxt < n and len(active) < slots:
            t += prefill_s
            active[nxt] = [t, 0]
            nxt += 1
            continue
        t += step_s
        for i in list(active):
            active[i][1] += 1
            if active[i][1] >= lengths[i]:
                rows[i] = (active[i][0], t, lengths[i])
                del active[i]
    writes = [max(f for _, f, _ in rows[b:b + batch]) for b in range(0, n, batch)]
    return rows, writes


def _eta(line: str) -> int | None:
    m = re.search(r"ETA (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", line)
    return None if m is None else int(m[1] or 0) * 3600 + int(m[2] or 0) * 60 + int(m[3] or 0)


def test_with_the_engine_at_hand_the_eta_counts_its_work_not_only_the_rows_written():
    """The soak's long local night (jobs/results/usability/2026-12-07-evening/soak.md): the
    engine fills its slots before any row finishes and rows are written a batch at a time,
    so the rate of rows written ran ~2x low for minutes (ETA 13m07s at 1m13s, done in 6m00s).
    Counting the rows the engine finished, and those decoding by their prefill and tokens,
    keeps the ETA within 0.85-1.15x of the time truly left from when it first shows (at the
    first rows) on; rows written alone ran 1.3-1.8x high here, and 4x at their second count."""
    rows, writes = _fill_first_night()
    n, end = len(rows), max(writes)
    clock = Clock()
    start = clock.t
    p = RunProgress(n, stream=io.StringIO(), tty=False, interval_s=1e9, clock=clock)

    def engine() -> tuple[int, int, int, int, float] | None:
        t = clock.t - start
        if t < 20.0:
            return None  # the model still loads
        done = [k for _, f, k in rows if f <= t]
        decoding = [(pe, f, k) for pe, f, k in rows if pe <= t < f]
        prefilled = sum(pe <= t for pe, _, _ in rows)  # the engine is never idle: prefilling or stepping
        return (len(done), sum(done), len(decoding), int(sum((t - pe) / (f - pe) * k for pe, f, k in decoding)),
                min(1.0, prefilled * 0.3 / (t - 20.0)) if t > 20.0 else 1.0)

    p.engine = engine
    shown: list[tuple[float, int, float]] = []  # (seconds in, rows written, ETA / time truly left)
    for second in range(int(end)):
        clock.t = start + second
        written = 16 * sum(w <= second for w in writes)
        if written != p.rows:
            p.update(min(written, n), 0, 32 * min(written, n))  # the tokens barely matter here
        else:
            p.tick()
        eta = _eta(p.line())
        if eta is not None:
            shown.append((second, written, eta / (end - second)))
    early = [(s, r, x) for s, r, x in shown if r <= 0.4 * n]
    assert early and early[0][1] == 48  # from the first rows written on
    assert all(0.85 <= x <= 1.15 for _, _, x in early), [(s, r, round(x, 2)) for s, r, x in early]


def test_the_engine_s_finished_rows_count_before_their_batch_is_written():
    """Rows done: the engine's finished rows (or the rows written, where more: error rows
    that never reach it), plus each decoding row as its prefill (the engine's prefill share)
    and its tokens of the finished rows' mean; the rate from when the engine first answered."""
    clock = Clock()
    p = RunProgress(100, stream=io.StringIO(), tty=False, interval_s=1e9, clock=clock)
    work: list[tuple[int, int, int, int, float] | None] = [None]
    p.engine = lambda: work[0]
    clock.t += 30
    p.tick()  # the model loads: no engine yet
    work[0] = (0, 0, 10, 0, 1.0)
    p.tick()  # the engine is made at 130
    clock.t += 50
    # 20 rows finished (20 tokens each), 10 decoding: half of each row's work is its prefill
    work[0] = (20, 400, 10, 0, 0.5)
    p.update(10, 0, 200)  # one batch of 10 written
    assert "ETA 2m30s" in p.line(), p.line()  # 20 + 10 x 0.5 = 25 rows' worth in 50 s: 75 left take 150 s
    work[0] = (20, 400, 10, 100, 0.0)  # no prefill: 100 tokens are 5 rows' worth
    p.tick()
    assert "ETA 2m30s" in p.line(), p.line()
    work[0] = (5, 100, 0, 0, 0.5)
    p.update(30, 0, 600)  # more rows written than the engine finished (read errors): the rows count
    assert "ETA 1m57s" in p.line(), p.line()  # 70 left at 30 per 50 s


def test_more_rows_than_the_estimate_drop_the_total():
    out, clock = io.StringIO(), Clock()
    p = RunProgress(2, stream=out, tty=False, clock=clock)
    clock.t += 1
    p.update(5, 0, 0)
    assert out.getvalue().strip().startswith("rows 5 | elapsed 1s | failed 0")


def test_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", "5")
    assert RunProgress(None, stream=io.StringIO(), tty=False).interval_s == 5.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", bad)
        with pytest.raises(ValueError, match="LONGDOC_PROGRESS_INTERVAL_S"):
            RunProgress(None, stream=io.StringIO(), tty=False)


def test_disabled_prints_nothing():
    out = io.StringIO()
    p = RunProgress(3, enabled=False, stream=out, tty=False)
    p.update(1, 0, 1)
    p.close()
    assert out.getvalue() == ""


# ----------------------------------------------------------------------------- totals
def _spec(tmp_path: Path, fmt: str, **over) -> object:
    d = {"name": "p", "input": {"uri": str(tmp_path / "in"), "format": fmt}}
    for k, v in over.items():
        section, key = k.split("__")
        d.setdefault(section, {})[key] = v
    return spec_from_dict(d)


def test_estimate_text_corpus_counts_files_minus_done(tmp_path):
    assert estimate_requests(_spec(tmp_path, "text"), 5) == 5
    assert estimate_requests(_spec(tmp_path, "text", input__limit=3), 5, skipped=1) == 2
    qa = _spec(tmp_path, "text", task__kind="qa", task__questions=["a?", "b?"])
    assert estimate_requests(qa, 5) == 10


def test_estimate_never_reads_the_input(tmp_path):
    """JSONL and Parquet documents per file live in the data: no estimate before the read
    stage's ledger tells (the input folder does not even exist here: nothing is opened)."""
    for fmt in ("jsonl", "parquet"):
        assert estimate_requests(_spec(tmp_path, fmt), 2) is None
        qa = _spec(tmp_path, fmt, task__kind="qa", input__question_field="qs")
        assert estimate_requests(qa, 2) is None


def test_ledger_total_counts_each_new_request_once():
    reqs = [{"request_id": r} for r in ("a", "b", "b", "c")]  # "b": an input row repeated exactly
    assert ledger_total(reqs, frozenset({"c"})) == 2


def test_a_tick_that_fails_is_said_once_and_the_ticks_go_on(capsys):
    """A review: the Ray runner's tick thread looks at the ledger in storage every second; an
    error there ended the thread with a traceback (the line stood still for the rest of the
    run), and on its first call failed the run."""
    import time

    from pipeline.progress import ticking

    calls: list[float] = []

    def on_wait() -> None:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise OSError("storage hiccup")

    with ticking(on_wait, 0.01):
        time.sleep(0.3)
    assert len(calls) > 5
    err = capsys.readouterr().err
    assert err.count("note: the progress line could not update (OSError: storage hiccup)") == 1
    assert "Traceback" not in err


def test_an_engine_gone_quiet_gives_the_eta_back_to_the_rows_written():
    """A Ray run's board lost, or every report stale (pipeline/engine_board.py): the engine
    answers None again, and the ETA is the rows-written rate's, as if there had been no
    engine, not the gone engine's old rows counted at a falling rate."""
    clock = Clock()
    with_engine = RunProgress(100, stream=io.StringIO(), tty=False, interval_s=1e9, clock=clock)
    without = RunProgress(100, stream=io.StringIO(), tty=False, interval_s=1e9, clock=clock)
    work: list[tuple[int, int, int, int, float] | None] = [(0, 0, 10, 0, 1.0)]
    with_engine.engine = lambda: work[0]
    for p in (with_engine, without):
        p.tick()
    clock.t += 50
    work[0] = (40, 800, 10, 0, 0.5)
    for p in (with_engine, without):
        p.update(10, 0, 200)
    assert _eta(with_engine.line()) != _eta(without.line())  # the engine's work counts
    clock.t += 50
    work[0] = None  # the board is gone
    for p in (with_engine, without):
        p.update(20, 0, 400)
    assert _eta(with_engine.line()) == _eta(without.line()) is not None, with_engine.line()
    # It answers again: its rate runs from its first answer, not from its return (which
    # would divide all the work done by the seconds since: an ETA of seconds).
    clock.t += 10
    work[0] = (60, 1200, 0, 0, 0.5)
    with_engine.tick()
    assert _eta(with_engine.line()) == round((100 - 60) * 110 / 60), with_engine.line()


def test_one_engine_more_is_not_a_new_phase():
    """Ray's line names the engines' count ("2 engines: ..."): an actor coming up, or a
    report gone stale and back, is the same phase, not a plain line more in the log."""
    out = io.StringIO()
    p = RunProgress(4, stream=out, tty=False, interval_s=1e9, clock=Clock())
    doing = ["engine: 1 prefilling, 0 queued"]
    p.activity = lambda: doing[0]
    p.tick()
    doing[0] = "2 engines: 2 prefilling, 0 queued"
    p.tick()
    doing[0] = "engine: 1 decoding (2 tokens), 0 prefilling, 0 queued"
    p.tick()
    assert len(out.getvalue().splitlines()) == 1, out.getvalue()
