"""pipeline/date_lease.py: one run of an output's date at a time.

Two runs of one date did every request twice and could publish a row twice. The lease is
checked here as a user meets it: a second `longdoc run` of a date refused in seconds
(exit 75) before any model loads; a run whose holder is gone (its process ended, its
lease not renewed) takes the date over; two runs taking a free date at once leave one
holder; a run that lost its lease publishes nothing; `report` tells a running run from
one whose driver is gone; and the same on the S3-compatible server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from s3_server import moto_s3

from pipeline.date_lease import DATE_IN_USE_EXIT, DateInUse, DateLease, Holder, lease_holder
from pipeline.report.load import load_output, run_summaries
from pipeline.runner import run_job
from schemas.spec import JobSpec
from stages.layout import lease_path, run_record_path
from stages.write import write_bytes_atomic

DATE = "2026-03-01"
LONGDOC = str(Path(sys.executable).parent / "longdoc")
FAST = {"renew_s": 0.1, "stale_s": 0.8, "settle_s": 0.05}


def _foreign(root: str, run_id: str = "other", host: str | None = None, pid: int | None = None,
             seen_at: float | None = None, beat: int = 0) -> None:
    """A lease written by another run (this host and this live process unless said)."""
    h = Holder(run_id, "job", host or socket.gethostname(), pid or os.getpid(), "2026-03-01T01:00:00+00:00",
               time.time() if seen_at is None else seen_at, beat)
    write_bytes_atomic(json.dumps(h.__dict__).encode(), lease_path(root, DATE))


def _ended_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_free_date_is_taken_renewed_and_released(tmp_path):
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", **FAST)
    lease.acquire()
    first = lease_holder(root, DATE)
    assert (first.run_id, first.host, first.pid) == ("r1", socket.gethostname(), os.getpid())
    deadline = time.time() + 5
    while lease_holder(root, DATE).beat == first.beat and time.time() < deadline:
        time.sleep(0.05)
    assert lease_holder(root, DATE).beat > first.beat, "the lease was not renewed"
    lease.release()
    assert lease_holder(root, DATE) is None and not os.path.exists(lease_path(root, DATE))


def test_a_live_run_of_this_host_is_refused_at_once_by_name(tmp_path):
    root = str(tmp_path / "out")
    _foreign(root)
    t0 = time.monotonic()
    with pytest.raises(DateInUse) as e:
        DateLease(root, DATE, "r2", "job", **FAST).acquire()
    assert time.monotonic() - t0 < 0.5  # same host: its process tells, no watching
    msg = str(e.value)
    assert "run other" in msg and f"pid {os.getpid()}" in msg and socket.gethostname() in msg
    assert lease_path(root, DATE) in msg and "another --date" in msg
    assert lease_holder(root, DATE).run_id == "other"  # untouched


@pytest.mark.parametrize("why", ["ended", "silent"])
def test_a_gone_run_of_this_host_is_taken_over_with_a_note(tmp_path, why):
    """Its process ended (SIGKILL, a crash), or it lives (a pid reused) but has not renewed."""
    root = str(tmp_path / "out")
    if why == "ended":
        _foreign(root, pid=_ended_pid())
    else:
        _foreign(root, seen_at=time.time() - 60)
    said: list[str] = []
    lease = DateLease(root, DATE, "r2", "job", say=said.append, **FAST)
    lease.acquire()
    assert lease_holder(root, DATE).run_id == "r2" and lease.held
    assert len(said) == 1 and "held by a run that is gone" in said[0] and "run other" in said[0]
    lease.release()


def test_another_hosts_run_is_watched_refused_while_it_renews_taken_once_silent(tmp_path):
    root = str(tmp_path / "out")
    _foreign(root, host="elsewhere", pid=1, seen_at=time.time() + 3600)  # its clock is not ours
    stop = threading.Event()

    def renewing() -> None:
        beat = 0
        while not stop.wait(0.1):
            beat += 1
            _foreign(root, host="elsewhere", pid=1, seen_at=time.time() + 3600, beat=beat)

    t = threading.Thread(target=renewing)
    t.start()
    try:
        with pytest.raises(DateInUse):  # a busy machine may hold the renewer back: 2 s to see one beat
            DateLease(root, DATE, "r2", "job", **{**FAST, "stale_s": 2.0}).acquire()
    finally:
        stop.set()
        t.join()
    said: list[str] = []
    t0 = time.monotonic()
    lease = DateLease(root, DATE, "r3", "job", say=said.append, **FAST)
    lease.acquire()  # silent now: taken after watching stale_s
    assert FAST["stale_s"] <= time.monotonic() - t0 < 5
    assert lease_holder(root, DATE).run_id == "r3"
    assert "watching up to" in said[0] and "gone" in said[1]
    lease.release()


def test_a_run_resumed_under_its_id_takes_its_own_lease_and_a_torn_file_holds_nothing(tmp_path):
    root = str(tmp_path / "out")
    _foreign(root, run_id="r1", host="elsewhere", pid=1)
    lease = DateLease(root, DATE, "r1", "job", **FAST)
    lease.acquire()  # no watching: it is this run's own
    assert lease_holder(root, DATE).host == socket.gethostname()
    lease.release()
    Path(lease_path(root, DATE)).write_text('{"run_id": "x", "jo')  # an unfinished write
    lease = DateLease(root, DATE, "r4", "job", **FAST)
    lease.acquire()
    assert lease_holder(root, DATE).run_id == "r4"
    lease.release()


def test_two_runs_taking_a_free_date_at_once_leave_one_holder(tmp_path):
    root = str(tmp_path / "out")
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def take(run_id: str) -> None:
        lease = DateLease(root, DATE, run_id, "job", **FAST)
        barrier.wait()
        try:
            lease.acquire()
            results[run_id] = lease
        except DateInUse as e:
            results[run_id] = e

    threads = [threading.Thread(target=take, args=(r,)) for r in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = [r for r, v in results.items() if isinstance(v, DateLease)]
    refused = [r for r, v in results.items() if isinstance(v, DateInUse)]
    assert len(held) == 1 and len(refused) == 1 and lease_holder(root, DATE).run_id == held[0]
    results[held[0]].release()


def test_a_run_that_lost_its_lease_stops_renewing_and_leaves_the_new_holders_lease(tmp_path):
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", renew_s=3600, stale_s=1, settle_s=0)
    lease.acquire()
    _foreign(root, run_id="r2")  # it stalled past stale_s and r2 took the date over
    assert lease.renew() is False and not lease.held and lease.taken_by.run_id == "r2"
    lease.release()
    assert lease_holder(root, DATE).run_id == "r2"


class _TakenOver(DateLease):
    """A lease that another run takes over right after this run took it (a stalled run)."""

    def acquire(self) -> None:
        super().acquire()
        _foreign(self.root, run_id="taker")
        self.renew()


def _spec(tmp_path: Path) -> JobSpec:
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"d{i}", "text": f"Document {i} is about river {i}. " * 8})
                              for i in range(3)))
    return JobSpec.model_validate({
        "name": "lease",
        "input": {"uri": str(data), "format": "jsonl"},
        "compression": {"method": "truncate", "target_tokens": 40},
        "generation": {"model": "random:tiny", "max_new_tokens": 4},
        "output": {"uri": str(tmp_path / "out")},
    })


def test_a_run_that_lost_its_date_publishes_nothing_and_the_next_run_does(tmp_path, monkeypatch):
    import pipeline.runner as runner

    spec = _spec(tmp_path)
    root = str(tmp_path / "out")
    monkeypatch.setattr(runner, "DateLease", _TakenOver)
    lost = run_job(spec, run_date=DATE, run_id="lost", progress=False, runner="local")
    assert lost.summary["status"] == "interrupted" and "taker" in lost.summary["interrupted_by"]
    assert not (tmp_path / "out" / f"run_date={DATE}").exists(), "published without the date"
    assert lease_holder(root, DATE).run_id == "taker"  # not removed by the run that lost it
    monkeypatch.undo()
    write_bytes_atomic(b"", lease_path(root, DATE))  # the taker is gone (its lease unreadable)
    after = run_job(spec, run_date=DATE, run_id="next", progress=False, runner="local")
    ids = pq.read_table(tmp_path / "out" / f"run_date={DATE}").column("request_id").to_pylist()
    assert after.summary["status"] == "succeeded" and len(ids) == len(set(ids)) == 3
    assert after.skipped == 3  # the lost run's staged rows, published, not redone
    assert lease_holder(root, DATE) is None


def test_longdoc_run_of_a_held_date_exits_75_before_any_model_loads(tmp_path):
    spec = _spec(tmp_path)
    path = tmp_path / "lease.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    root = str(tmp_path / "out")
    _foreign(root, run_id="nightly")  # this test's own live process holds it
    t0 = time.monotonic()
    r = subprocess.run([LONGDOC, "run", str(path), "--date", DATE], capture_output=True, text=True, timeout=120)
    assert r.returncode == DATE_IN_USE_EXIT == 75, r.stderr[-2000:]
    assert "another run is writing" in r.stderr and "run nightly" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 60 and "loading the model" not in r.stderr
    assert not (tmp_path / "out.runs" / DATE).exists(), "a refused run left a record"


def test_report_tells_a_running_run_from_one_whose_driver_is_gone(tmp_path):
    root = str(tmp_path / "out")

    def started(run_id: str) -> None:
        write_bytes_atomic(json.dumps({"summary": {"started_at": "2026-03-01T02:00:00+00:00",
                                                   "status": "running"}}).encode(),
                           run_record_path(root, DATE, run_id))

    started("r1")
    _foreign(root, run_id="r1")
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "running" and "running on host" in only["note"]
    _foreign(root, run_id="r1", pid=_ended_pid())
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "ended unrecorded" and "run the date again" in only["note"]


def test_the_lease_works_on_an_s3_compatible_store(monkeypatch):
    with moto_s3() as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        s3.filesystem().mkdir("lease-bucket")
        root = "s3://lease-bucket/out"
        lease = DateLease(root, DATE, "r1", "job", **FAST)
        lease.acquire()
        assert lease_holder(root, DATE).run_id == "r1"
        with pytest.raises(DateInUse):
            DateLease(root, DATE, "r2", "job", **FAST).acquire()
        lease.release()
        assert lease_holder(root, DATE) is None
