"""pipeline/engine_board.py on a real local Ray: generate actors' reports reach the driver's
progress line without blocking it, and a report that stops coming leaves the sums. On a
cluster of two raylets: tests/pipeline/test_cluster_limits.py; from a job the Jobs API
started: tests/pipeline/ops/test_submit.py (both slow)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from pipeline.engine_board import board_name, open_board
from stages.decoding.snapshot import EngineSnapshot


def _reporter_class():
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class Reporter:
        """A stand-in for a generate actor: posts a fixed engine snapshot from a thread of its own."""

        def __init__(self, board: str, decoding: int, rows_done: int, every_s: float) -> None:
            import threading

            from pipeline.engine_board import post_reports

            self.stop = threading.Event()
            snap = EngineSnapshot(decoding=decoding, decoding_tokens=decoding * 3, queued=1,
                                  rows_done=rows_done, tokens_out=rows_done * 4, prefill_s=1.0, step_s=1.0)
            threading.Thread(target=post_reports, args=(board, lambda: snap, self.stop, every_s),
                             daemon=True).start()

        def halt(self) -> None:
            self.stop.set()

    return Reporter


def _until(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    """Wait for ``condition()`` to be truthy (polled), failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_reports_from_actor_threads_are_summed_and_stale_ones_dropped(ray_session) -> None:
    view = open_board(board_name("t-board"), stale_s=5.0)  # 5 s: a loaded machine may starve a reporter a while
    actors = []
    try:
        assert view.name.startswith("longdoc-engine-board-t-board-")
        assert view.activity() == "" and view.progress() is None  # nothing reported yet: no wait either
        Reporter = _reporter_class()
        a = Reporter.remote(view.name, 2, 5, 0.2)
        b = Reporter.remote(view.name, 1, 3, 0.2)
        actors += [a, b]
        _until(lambda: len(view.snapshots()) == 2, "both actors' reports")
        assert view.activity() == "2 engines: 3 decoding (9 tokens), 0 prefilling, 2 queued"
        assert view.progress() == (8, 32, 3, 9, 0.5)
        # One actor stops reporting (as a dead one does): its last report leaves the sums.
        ray_session.get(a.halt.remote())
        _until(lambda: len(view.snapshots()) == 1, "the silent actor's report dropped")
        assert view.activity() == "engine: 1 decoding (3 tokens), 0 prefilling, 1 queued"
        assert view.progress() == (3, 12, 1, 3, 0.5)
        ray_session.get(b.halt.remote())
        _until(lambda: view.snapshots() == [], "every report dropped")
        assert view.activity() == "" and view.progress() is None
    finally:
        for actor in actors:  # their worker processes would live on for the test session
            ray_session.kill(actor)
        view.close()


def test_a_board_gone_fails_no_reporter_and_leaves_the_line_empty(ray_session) -> None:
    view = open_board(board_name("t-gone"), stale_s=1.0)
    Reporter = _reporter_class()
    r = Reporter.remote(view.name, 1, 0, 0.1)
    try:
        _until(lambda: view.snapshots(), "the report")
        ray_session.kill(view.board)  # the board is lost: the reporter's posts fail, quietly
        # The view never blocks on it, and once its last reading is stale it says nothing.
        _until(lambda: view.activity() == "" and view.progress() is None, "the old reading dropped")
        assert ray_session.get(r.halt.remote(), timeout=30) is None  # the actor lives on, unharmed
    finally:
        ray_session.kill(r)
        view.close()
    assert view.activity() == ""  # closed: asks nothing more


def test_a_ray_runs_line_shows_the_engines_work_before_its_first_row(tmp_path, tiny_model_dir, ray_session,
                                                                     monkeypatch, capfd) -> None:
    """pipeline/runner.py's Ray line: the engine's counts (the board's), not only "Ray: ...",
    while no row is written yet."""
    import json

    from pipeline.runner import run_job
    from schemas.loading import spec_from_dict

    # Rows of 256 tokens each decoded one after another take the tiny model seconds (~0.25 s
    # a row on one core): ~10 s for 40, while a report reaches the line within ~3 s (posted
    # every second, read every second, printed at the next tick). 16 rows' ~4 s failed once
    # in 3 runs on a loaded machine.
    n = 40
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "text": f"Document {i} is about the tide. " * 40}) + "\n")
    spec = spec_from_dict({
        "name": "p", "input": {"uri": str(tmp_path / "docs.jsonl"), "format": "jsonl"},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 256},
        # One batch of every row, decoded one at a time: no row is written before the last finishes.
        "resources": {"batch_size": n, "decode_slots": 1}, "output": {"uri": str(tmp_path / "out")},
    })
    monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", "0.01")
    result = run_job(spec, runner="ray", run_date="2026-01-01", run_id="eb1", progress=True)
    assert result.summary["rows"] == n
    lines = [ln.strip() for ln in capfd.readouterr().err.splitlines() if ln.strip().startswith("rows ")]
    # Before the first row: what the generate actor's engine holds, read from the board, with
    # the run's rows in it (decoding or queued), not only the idle engine's first report.
    assert any(re.search(r"^rows 0\b.* \| engine: \d+ decoding \(\d+ tokens\), .*\d+ queued$", ln)
               and re.search(r"engine: [1-9]\d* decoding|[1-9]\d* queued$", ln) for ln in lines), lines
