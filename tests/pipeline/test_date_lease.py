"""pipeline/date_lease.py: one run of an output's date at a time.

Two runs of one date did every request twice and could publish a row twice. The lease is
checked here as a user meets it: a second `longdoc run` of a date refused in seconds
(exit 75) before any model loads; a run whose holder is gone (its process ended, its
lease not renewed) takes the date over; two runs taking a free date at once leave one
holder; a run that lost its lease publishes nothing; `report` tells a running run from
one whose driver is gone; and the same on the S3-compatible server.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from s3_server import moto_s3

from pipeline.date_lease import (
    DATE_IN_USE_EXIT,
    DateInUse,
    DateLease,
    Holder,
    LinkedLease,
    lease_holder,
    machine_id,
)
from pipeline.report.load import load_output, run_summaries
from pipeline.runner import run_job
from schemas.spec import JobSpec
from stages.layout import lease_path, run_record_path
from stages.write import write_bytes_atomic

DATE = "2026-03-01"
LONGDOC = str(Path(sys.executable).parent / "longdoc")
ROOT = Path(__file__).resolve().parents[2]
FAST = {"renew_s": 0.1, "stale_s": 0.8, "settle_s": 0.05}


def _foreign(root: str, run_id: str = "other", machine: str | None = None, pid: int | None = None,
             seen_at: float | None = None, beat: int = 0, token: str = "their-token") -> None:
    """A lease file written by another process (on this machine, and this live process, unless said)."""
    h = Holder(run_id=run_id, job="job", host="their-host", machine=machine or machine_id(), pid=pid or os.getpid(),
               token=token, started_at="2026-03-01T01:00:00+00:00",
               seen_at=time.time() if seen_at is None else seen_at, beat=beat)
    write_bytes_atomic(json.dumps(asdict(h)).encode(), lease_path(root, DATE))


@pytest.fixture
def no_locks(monkeypatch):
    """A folder whose filesystem has no kernel locks (some FUSE and network mounts): the
    date is held the object store's way, through the lease file alone."""
    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


class _Renewing:
    """Another process renewing its lease (a thread here), until the block ends."""

    def __init__(self, root: str, after_s: float = 0.0, every_s: float = 0.1, **holder) -> None:
        self.args, self.after_s, self.every_s, self.stop = (root, holder), after_s, every_s, threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        if self.after_s and self.stop.wait(self.after_s):
            return
        beat = 1
        while True:
            _foreign(self.args[0], beat=beat, **self.args[1])
            beat += 1
            if self.stop.wait(self.every_s):
                return

    def __enter__(self):
        if not self.after_s:  # there from the start
            _foreign(self.args[0], beat=0, **self.args[1])
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _ended_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


_HOLD = """
import sys
from pipeline.date_lease import DateLease
DateLease(sys.argv[1], sys.argv[2], sys.argv[3], "nightly").acquire()
print("held", flush=True)
sys.stdin.read()  # held until the test closes its stdin, or the test process dies
"""


def _holding_process(root: str, run_id: str) -> subprocess.Popen:
    """Another `longdoc run` holding the date (a process of its own, as a second run meets it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1"}
    p = subprocess.Popen([sys.executable, "-c", _HOLD, root, DATE, run_id], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    ready, _, _ = select.select([p.stdout], [], [], 120)
    assert ready and p.stdout.readline().strip() == "held", "the holding process did not take the date"
    return p


def _one_of_two_takes_it(root: str, settle_s: float = FAST["settle_s"]) -> None:
    """Two runs take the free date at the same instant: one holds it, the other is refused."""
    barrier = threading.Barrier(2)
    results: dict[str, DateLease | DateInUse] = {}

    def take(run_id: str) -> None:
        lease = DateLease(root, DATE, run_id, "job", **{**FAST, "settle_s": settle_s})
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


def test_a_free_date_is_taken_renewed_and_released(tmp_path):
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", **FAST)
    lease.acquire()
    first = lease_holder(root, DATE)
    assert (first.run_id, first.machine, first.pid, first.token) == ("r1", machine_id(), os.getpid(), lease.token)
    deadline = time.time() + 10
    while lease_holder(root, DATE).beat == first.beat and time.time() < deadline:
        time.sleep(0.05)
    assert lease_holder(root, DATE).beat > first.beat, "the lease was not renewed"
    assert not lease.lost and lease.confirm()
    lease.release()
    assert lease_holder(root, DATE) is None and not os.path.exists(lease_path(root, DATE))


def test_a_lock_file_that_is_a_link_is_refused_never_followed(tmp_path):
    """A security review planted `DATE.json.lock` -> a missing path: a run created an empty file
    there (as root: anywhere). The lock is opened without following links; a link is refused
    by name, and `longdoc run` exits 2 before anything loads."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    root = str(tmp_path / "out")
    victim = tmp_path / "elsewhere" / "created_by_lock"
    victim.parent.mkdir()
    lock = Path(f"{lease_path(root, DATE)}.lock")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(victim)
    with pytest.raises(LinkedLease, match="is a symbolic link: longdoc does not follow links"):
        DateLease(root, DATE, "r1", "job", **FAST).acquire()
    assert not victim.exists()
    # ... and so is a linked lease folder (the lock's own flag guards its last name only)
    other = tmp_path / "other"
    other.mkdir()
    linked = str(tmp_path / "linked")
    Path(f"{linked}.runs").mkdir()
    Path(f"{linked}.runs/_leases").symlink_to(other)
    with pytest.raises(LinkedLease, match="_leases is a symbolic link"):
        DateLease(linked, DATE, "r1", "job", **FAST).acquire()
    assert not list(other.iterdir())
    path = tmp_path / "lease.yaml"
    path.write_text(json.dumps(_spec(tmp_path).model_dump(mode="json")))
    res = CliRunner().invoke(app, ["run", str(path), "--date", DATE, "--runner", "local"])
    assert res.exit_code == 2 and "is a symbolic link" in res.output and not victim.exists(), res.output


def test_a_live_run_is_refused_at_once_by_name_and_a_killed_one_taken_over_at_once(tmp_path):
    """The kernel's lock: a second run (even resuming the same run id) is refused while the
    first process lives, stopped or not; once it is killed the next run takes the date."""
    root = str(tmp_path / "out")
    holder = _holding_process(root, "nightly")
    try:
        t0 = time.monotonic()
        for run_id in ("r2", "nightly"):
            with pytest.raises(DateInUse) as e:
                DateLease(root, DATE, run_id, "job").acquire()
            msg = str(e.value)
            assert "run nightly" in msg and f"pid {holder.pid}" in msg and "another --date" in msg
        assert time.monotonic() - t0 < 5  # no watching on a local folder
        holder.send_signal(signal.SIGSTOP)  # stopped, and not renewing for a while
        _foreign(root, run_id="nightly", pid=holder.pid, seen_at=time.time() - 60, token="theirs")
        with pytest.raises(DateInUse) as e:
            DateLease(root, DATE, "r3", "job").acquire()
        assert f"end it (pid {holder.pid}" in str(e.value)
        holder.kill()
        holder.wait()
    finally:
        holder.kill()
        holder.wait()
    said: list[str] = []
    lease = DateLease(root, DATE, "r4", "job", say=said.append)
    lease.acquire()
    assert lease_holder(root, DATE).run_id == "r4" and "held by a run that is gone" in said[0]
    lease.release()


@pytest.mark.parametrize("locks", [True, False])
def test_two_runs_taking_a_free_date_at_once_leave_one_holder(tmp_path, request, locks):
    if not locks:
        request.getfixturevalue("no_locks")  # the write and read back decide
    _one_of_two_takes_it(str(tmp_path / "out"))


def test_without_locks_a_live_process_here_is_refused_and_an_ended_one_taken_over(tmp_path, no_locks):
    root = str(tmp_path / "out")
    _foreign(root, seen_at=time.time() - 3600)  # this live process, silent for an hour: alive, never taken
    with pytest.raises(DateInUse):
        DateLease(root, DATE, "r2", "job", **FAST).acquire()
    _foreign(root, pid=_ended_pid())
    said: list[str] = []
    lease = DateLease(root, DATE, "r2", "job", say=said.append, **FAST)
    lease.acquire()
    assert lease_holder(root, DATE).token == lease.token and "gone" in said[0]
    with pytest.raises(DateInUse):  # the write-and-read-back path holds it too
        DateLease(root, DATE, "r3", "job", **FAST).acquire()
    lease.release()


def test_a_mount_whose_locks_hold_on_one_machine_only_still_judges_another_machines_lease(tmp_path, monkeypatch):
    """NFS with `nolock`, some FUSE mounts: flock succeeds on both machines."""
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)
    root = str(tmp_path / "out")
    with _Renewing(root, machine="elsewhere", pid=1), pytest.raises(DateInUse):
        DateLease(root, DATE, "r2", "job", **{**FAST, "stale_s": 5.0}).acquire()
    lease = DateLease(root, DATE, "r3", "job", **FAST)
    lease.acquire()  # silent now: taken after the watch
    assert lease_holder(root, DATE).token == lease.token
    lease.release()


def test_a_lease_of_another_format_is_read_by_its_values_or_not_at_all(tmp_path):
    root = str(tmp_path / "out")
    write_bytes_atomic(json.dumps({"run_id": "x", "pid": "7", "seen_at": "12.5", "beat": 3, "new": 1}).encode(),
                       lease_path(root, DATE))
    h = lease_holder(root, DATE)
    assert (h.pid, h.seen_at, h.beat) == (7, 12.5, 3) and h.state(time.time()) == "ended"
    write_bytes_atomic(json.dumps({"run_id": "x", "seen_at": "soon"}).encode(), lease_path(root, DATE))
    assert lease_holder(root, DATE) is None


def test_another_machines_run_is_watched_refused_while_it_renews_taken_once_silent(tmp_path, no_locks):
    root = str(tmp_path / "out")
    elsewhere = {"machine": "elsewhere", "pid": 1, "seen_at": time.time() + 3600}  # its clock is not ours
    with _Renewing(root, **elsewhere), pytest.raises(DateInUse) as e:
        DateLease(root, DATE, "r2", "job", **{**FAST, "stale_s": 5.0}).acquire()
    assert "by that machine's clock" in str(e.value)
    said: list[str] = []
    t0 = time.monotonic()
    lease = DateLease(root, DATE, "r3", "job", say=said.append, **FAST)
    lease.acquire()  # silent now: taken after watching stale_s
    assert FAST["stale_s"] <= time.monotonic() - t0 < 10
    assert lease_holder(root, DATE).run_id == "r3"
    assert "watching up to" in said[0] and "gone" in said[1]
    lease.release()


def test_a_lease_changing_hands_while_watched_is_judged_again(tmp_path, no_locks):
    """A gone run's lease, watched by two runs: the one that took it first is not overwritten."""
    root = str(tmp_path / "out")
    _foreign(root, machine="elsewhere", pid=1, token="gone-run")
    with _Renewing(root, after_s=0.2, run_id="first-taker", machine="elsewhere-too", pid=2, token="taker"), \
            pytest.raises(DateInUse) as e:
        DateLease(root, DATE, "r2", "job", **{**FAST, "stale_s": 5.0}).acquire()
    assert "run first-taker" in str(e.value)


def test_a_lease_this_version_cannot_read_is_watched_refused_while_it_moves_taken_once_still(tmp_path, no_locks):
    """A newer longdoc's lease, renewed: refused (never a loop); a torn one left still: taken."""
    root = str(tmp_path / "out")
    stop = threading.Event()

    def newer_format() -> None:
        n = 0
        while not stop.wait(0.1):
            n += 1
            write_bytes_atomic(json.dumps({"holder": {"run": "x"}, "n": n}).encode(), lease_path(root, DATE))

    write_bytes_atomic(b'{"holder": {}}', lease_path(root, DATE))
    t = threading.Thread(target=newer_format)
    t.start()
    try:
        with pytest.raises(DateInUse) as e:
            DateLease(root, DATE, "r3", "job", **{**FAST, "stale_s": 5.0}).acquire()
        assert "cannot read" in str(e.value)
    finally:
        stop.set()
        t.join()
    Path(lease_path(root, DATE)).write_text('{"run_id": "x", "jo')  # an unfinished write
    said: list[str] = []
    lease = DateLease(root, DATE, "r4", "job", say=said.append, **FAST)
    lease.acquire()
    assert lease_holder(root, DATE).run_id == "r4" and "cannot read" in said[0]
    lease.release()


def test_a_run_that_lost_its_lease_stops_renewing_and_leaves_the_new_holders_lease(tmp_path):
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", renew_s=3600, stale_s=30, settle_s=0)
    lease.acquire()
    _foreign(root, run_id="r2")  # another process wrote over it (its lock file removed by hand)
    assert lease.renew() is False and lease.lost and lease.taken_by.run_id == "r2"
    assert not lease.confirm() and "run r2" in lease.lost_reason
    with pytest.raises(DateInUse):
        lease.ensure()
    lease.release()
    assert lease_holder(root, DATE).run_id == "r2"


def test_renewals_that_fail_for_half_the_lease_forbid_publishing_and_release_never_raises(tmp_path, monkeypatch):
    """Expired credentials raise no OSError: the renewal thread must live on, and a run that
    cannot renew must not publish (others may take it for gone)."""
    import pipeline.date_lease as date_lease

    now = [0.0]
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", renew_s=3600, stale_s=30, settle_s=0, monotonic=lambda: now[0])
    lease.acquire()

    def expired(*_a, **_k):
        raise RuntimeError("NoCredentialsError: Unable to locate credentials")

    monkeypatch.setattr(date_lease, "write_bytes_atomic", expired)
    now[0] = 10.0
    assert lease.renew() is True and lease.confirm()  # renewed 10 s ago: still its own
    now[0] = 16.0
    assert not lease.lost and not lease.confirm() and "could not be renewed for 16 s" in lease.lost_reason
    monkeypatch.setattr(lease.fs, "rm", expired)
    lease.release()  # no raise: the lease lapses by itself


class _TakenOver(DateLease):
    """A lease that another process takes over once the run has published what it found
    staged and started its stages (the run stalled); the taker's process has ended by the
    time the next run looks."""

    def ensure(self) -> None:
        super().ensure()
        _foreign(self.root, run_id="taker", pid=_ended_pid())
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
    s = lost.summary
    assert (s["status"], s["interrupted_by"], s["taken_over_by"]) == ("interrupted", "date taken over", "taker")
    assert "run taker" in s["taken_over"]  # (it stops at its next block; here its one block)
    assert not (tmp_path / "out" / f"run_date={DATE}").exists(), "published without the date"
    assert lease_holder(root, DATE).run_id == "taker"  # not removed by the run that lost it
    monkeypatch.undo()
    after = run_job(spec, run_date=DATE, run_id="next", progress=False, runner="local")  # the taker is gone
    ids = pq.read_table(tmp_path / "out" / f"run_date={DATE}").column("request_id").to_pylist()
    assert after.summary["status"] == "succeeded" and len(ids) == len(set(ids)) == 3
    assert after.skipped == s["rows"]  # the lost run's staged rows, published, not redone
    assert lease_holder(root, DATE) is None


def test_longdoc_run_of_a_held_date_exits_75_before_any_model_loads(tmp_path):
    spec = _spec(tmp_path)
    path = tmp_path / "lease.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    root = str(tmp_path / "out")
    holder = _holding_process(root, "nightly")
    t0 = time.monotonic()
    try:
        r = subprocess.run([LONGDOC, "run", str(path), "--date", DATE], capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
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
    (only,) = run_summaries(root, load_output(root))  # no lease (an earlier longdoc): it may be either
    assert only["status"] == "running" and "still running, or its driver ended" in only["note"]
    _foreign(root, run_id="r1")
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "running" and "running: run r1" in only["note"]
    _foreign(root, run_id="r1", seen_at=time.time() - 60)  # its process is there, not renewing
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "running" and "stalled" in only["note"] and "stopped or hung" in only["note"]
    _foreign(root, run_id="r1", pid=_ended_pid())
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "ended unrecorded" and "run the date again" in only["note"]
    # A live lease naming another run: this one's driver is gone whatever that process does.
    _foreign(root, run_id="r2")
    (only,) = run_summaries(root, load_output(root))
    assert only["status"] == "ended unrecorded" and "run the date again" in only["note"]
    # A run of the date that ENDED before this one started says nothing about it: still live.
    _foreign(root, run_id="r1")
    write_bytes_atomic(json.dumps({"summary": {"started_at": "2026-03-01T01:00:00+00:00", "status": "succeeded"}}
                                  ).encode(), run_record_path(root, DATE, "r0"))
    (r1,) = [s for s in run_summaries(root, load_output(root)) if s["run_id"] == "r1"]
    assert r1["status"] == "running" and "running: run r1" in r1["note"]


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
        _one_of_two_takes_it(root, settle_s=0.5)  # the store's create-if-absent (and the read back) let one in


def test_longdoc_run_that_lost_its_date_says_so_and_exits_75(tmp_path, monkeypatch):
    """Not "interrupted (SIGINT): run the same date again": that rerun would be refused, and
    the holder publishes this run's rows."""
    from typer.testing import CliRunner

    import pipeline.runner as runner
    from pipeline.cli import app

    path = tmp_path / "lease.yaml"
    path.write_text(json.dumps(_spec(tmp_path).model_dump(mode="json")))
    monkeypatch.setattr(runner, "DateLease", _TakenOver)
    res = CliRunner().invoke(app, ["run", str(path), "--date", DATE, "--runner", "local", "--quiet"])
    assert res.exit_code == 75, res.output
    assert "published nothing: run taker" in res.output and "nothing to rerun now" in res.output
    assert "SIGINT" not in res.output and "Traceback" not in res.output


# ------------------------------------------------- links planted in the output tree (stages/links.py)
def _elsewhere(tmp_path: Path) -> Path:
    """A folder outside the output: another output's staged block of DATE and committed file,
    a date ledger's file, a sentinel. A run that follows a link into it reads, publishes or
    deletes them."""
    from schemas.output import FILE_SCHEMA, rows_to_table

    d = tmp_path / "elsewhere"
    (d / DATE / "other-run").mkdir(parents=True)
    rows = [{"run_id": "other-run", "run_date": DATE, "job": "other", "doc_id": "x", "request_id": "foreign",
             "output_text": "not this output's"}]
    pq.write_table(rows_to_table(rows, FILE_SCHEMA), d / DATE / "other-run" / "part-0.staged")
    pq.write_table(rows_to_table(rows, FILE_SCHEMA), d / "foreign.parquet")
    (d / DATE / "precious.txt").write_text("not the ledger's")
    (d / "sentinel.txt").write_text("keep")
    return d


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# Where a link was planted (relative to the output root's parent, ``out`` the root) and what
# it points at, relative to ``_elsewhere``; what each did before it was refused (local runs).
PLANTED = {
    f"out/run_date={DATE}": ".",  # the run's row published (renamed) into the other folder
    f"out/run_date={DATE}/part-planted.parquet": "foreign.parquet",  # another output's rows taken as the date's
    "out.runs/_staging": ".",  # the other output's staged block published here, then deleted there
    f"out.runs/_staging/{DATE}": DATE,  # the same
    f"out.runs/_staging/{DATE}/next": f"{DATE}/other-run",  # the run's own blocks staged outside
    "out.runs/_ledger": ".",  # the folder's DATE/ removed whole at the run's start
    "out.runs/_complete": ".",  # the date's completion mark written (and read back) there
    f"out.runs/{DATE}": ".",  # the run records written there
    "out.runs/_scratch": ".",  # each publish's temporary files made there
}


@pytest.mark.parametrize("planted", PLANTED)
def test_a_link_planted_in_the_output_tree_is_refused_before_anything_is_written(tmp_path, planted):
    from stages.links import LinkedOutput

    elsewhere = _elsewhere(tmp_path)
    before = _files(elsewhere)
    link, target = tmp_path / planted, elsewhere / PLANTED[planted]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    with pytest.raises(LinkedOutput) as refused:
        run_job(_spec(tmp_path), run_date=DATE, run_id="next", progress=False, runner="local")
    assert f"{link} is a symbolic link (to {target})" in str(refused.value)
    assert f"rm '{link}'" in str(refused.value)
    assert _files(elsewhere) == before, "a refused run changed files outside its output"
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and not p.is_symlink()], "published rows"
    assert lease_holder(str(tmp_path / "out"), DATE) is None
    link.unlink()  # the fix the refusal names: the run goes, and writes only in its own tree
    done = run_job(_spec(tmp_path), run_date=DATE, run_id="next", progress=False, runner="local")
    assert done.summary["status"] == "succeeded" and done.summary["rows"] == 3
    assert _files(elsewhere) == before


def test_an_output_root_that_is_a_link_runs_and_reads_as_usual(tmp_path):
    """A user links the output folder to a bigger disk: the run writes through it, its run
    records sit beside the link, a rerun finds every row done; a date folder planted as a link
    to another date is not read as that date's rows (`report` counted them twice)."""
    real = tmp_path / "bigdisk" / "out"
    real.mkdir(parents=True)
    (tmp_path / "out").symlink_to(real)
    root = str(tmp_path / "out")
    first = run_job(_spec(tmp_path), run_date=DATE, run_id="first", progress=False, runner="local")
    assert first.summary["status"] == "succeeded" and first.summary["rows"] == 3
    assert len(list((real / f"run_date={DATE}").glob("*.parquet"))) == 1
    assert Path(run_record_path(root, DATE, "first")).is_file() and (tmp_path / "out.runs").is_dir()
    again = run_job(_spec(tmp_path), run_date=DATE, run_id="again", progress=False, runner="local")
    assert again.skipped == 3 and again.summary["rows"] == 0
    (real / "run_date=2026-03-02").symlink_to(real / f"run_date={DATE}")
    table = load_output(root)
    assert table.num_rows == 3 and set(table.column("run_date").to_pylist()) == {DATE}
    assert {s["run_date"] for s in run_summaries(root, table)} == {DATE}


def test_longdoc_validate_and_run_name_a_planted_link_and_exit_2(tmp_path):
    spec = _spec(tmp_path)
    path = tmp_path / "links.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    elsewhere = _elsewhere(tmp_path)
    link = tmp_path / "out.runs" / "_ledger"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    for command in ("validate", "run"):
        r = subprocess.run([LONGDOC, command, str(path), "--date", DATE], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr[-2000:]
        assert f"{link} is a symbolic link (to {elsewhere})" in r.stderr and "Traceback" not in r.stderr
        # Refused before the run began: no run record, so no model loaded either.
        assert not (tmp_path / "out.runs" / DATE).exists(), r.stderr[-2000:]
    assert (elsewhere / DATE / "precious.txt").is_file()


def test_a_holders_state_by_its_process_and_its_clock(tmp_path):
    """Another machine's run is judged gone only after FOREIGN_STALE_S without a renewal (a
    clock's skew is not an end); a pid reused by another process is not the holder; a run of
    this machine that stopped renewing is still the date's (`submit` must not start a second
    one); a lease whose run id is not text is not read."""
    from pipeline.date_lease import FOREIGN_STALE_S, STALE_S, _process_start, live_holder

    now = time.time()
    foreign = Holder(run_id="r", machine="another-machine", seen_at=now - STALE_S - 5)
    assert foreign.state(now) == "running"
    assert foreign.state(now + FOREIGN_STALE_S) == "ended"
    start = _process_start(os.getpid())
    assert Holder(run_id="r", machine=machine_id(), pid=os.getpid(), pid_start=start, seen_at=now).state(now) == "running"
    assert Holder(run_id="r", machine=machine_id(), pid=os.getpid(), pid_start=start + 1,
                  seen_at=now).state(now) == "ended"  # the same pid, another process
    root = str(tmp_path / "out")
    _foreign(root, seen_at=now - STALE_S - 5)  # this live process, silent: stalled
    assert lease_holder(root, DATE).state(time.time()) == "stalled" and live_holder(root, DATE) is not None
    write_bytes_atomic(json.dumps({"run_id": 5, "token": "t"}).encode(), lease_path(root, DATE))
    assert lease_holder(root, DATE) is None


def test_a_lease_not_ours_is_a_loss_never_removed_and_an_unreadable_one_is_watched(tmp_path):
    """A renewal that finds an unreadable lease in place of its own has lost the date; a
    release leaves another process's lease where it is; and a run finding an unreadable
    lease under a lock it was granted watches it before writing over it (a mount whose locks
    hold on one machine only)."""
    root = str(tmp_path / "out")
    lease = DateLease(root, DATE, "r1", "job", renew_s=3600, stale_s=0.8, settle_s=0.05)
    lease.acquire()
    write_bytes_atomic(b"\x00torn", lease_path(root, DATE))
    assert lease.renew() is False and lease.lost
    lease.release()
    lease = DateLease(root, DATE, "r2", "job", renew_s=3600, stale_s=0.8, settle_s=0.05)
    lease.acquire()
    _foreign(root, token="their-token")  # written over it (a mount without working locks)
    lease.release()
    assert lease_holder(root, DATE).token == "their-token"
    write_bytes_atomic(b"\x00torn", lease_path(root, DATE))
    notes: list[str] = []
    lease = DateLease(root, DATE, "r3", "job", renew_s=3600, stale_s=0.3, settle_s=0.05, say=notes.append)
    lease.acquire()
    assert any("a lease this longdoc cannot read holds" in n for n in notes), notes
    assert lease_holder(root, DATE).token == lease.token
    lease.release()
