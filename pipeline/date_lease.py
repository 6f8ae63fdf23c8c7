"""One run of an output's date at a time: a lease file beside the output, renewed while
the run goes.

Why: two runs of one date (a nightly schedule that fires while last night's run is still
going, a second `longdoc run` by hand, `submit --suffix` while the first job runs) would
each do every request (twice the bill), the second would publish the first's staged
blocks at its start (stages/partition.py publishes a crashed run's), and two commits at
once can publish a request twice. Storage offers no lock that every fsspec filesystem
honours, so the runs agree through a file:

- ``{root}.runs/_leases/{run_date}.json`` (stages/layout.py ``lease_path``) names the run
  that holds the date: run id, job, host, process id, when it started, and ``beat``, a
  counter with the time it was last renewed (``seen_at``, the holder's clock).
- ``DateLease.acquire`` takes the date when no lease is there, when the lease is this run
  id's (a run resumed under its id), or when its holder is gone: on this host its process
  has ended (or has not renewed for ``stale_s`` by this host's clock); on another host its
  ``beat`` did not change while this run watched for ``stale_s`` (clocks of two hosts are
  never compared). A holder that is alive gets ``DateInUse`` raised, naming it.
- Taking is a write, then a read back after ``settle_s``: of two runs that take at once the
  one whose write landed last holds the date, the other reads the winner back and is
  refused. On a local disk a free date is taken by an exclusive link.
- While the run goes a daemon thread renews the lease every ``renew_s``; a renewal that
  finds another run's lease there (this run had stalled past ``stale_s`` and was taken
  over) stops renewing, and ``held`` turns False: the runner then publishes nothing (its
  rows stay staged, and the holder publishes them). ``release`` removes the lease if it is
  still this run's.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import fsspec

from stages.layout import lease_path
from stages.write import is_local, write_bytes_atomic

#: `longdoc run`'s exit status when another run holds the date: EX_TEMPFAIL (sysexits.h),
#: "try again later", which a scheduler can tell from a failed run (1) or a bad spec (2).
DATE_IN_USE_EXIT = 75
#: Seconds between renewals while a run holds its date.
RENEW_S = 10.0
#: A lease not renewed for this long belongs to a run that is gone (3 renewals missed).
STALE_S = 30.0
#: Seconds between a taking write and its read back (object stores: a racing writer's
#: PUT lands within this).
SETTLE_S = 1.0


@dataclass(frozen=True)
class Holder:
    """What the lease file says of the run holding a date."""

    run_id: str
    job: str
    host: str
    pid: int
    started_at: str  # ISO 8601, UTC
    seen_at: float  # the holder's clock (time.time()) at its last renewal
    beat: int  # renewals so far: another host's liveness is seen by this changing

    def describe(self, now: float) -> str:
        ago = max(0, round(now - self.seen_at))
        return (f"run {self.run_id} of job {self.job!r} on host {self.host} (pid {self.pid}), "
                f"started {self.started_at}, last renewed {ago} s ago")


    def gone(self, now: float, host: str) -> bool:
        """Whether the holder has stopped, as far as one look tells: on ``host`` (this
        machine) its process has ended or it has not renewed for ``STALE_S``; on another
        host its last renewal is ``STALE_S`` old by this clock (clocks may differ: taking
        a lease watches ``beat`` instead, ``DateLease.acquire``)."""
        if self.host == host and not _pid_running(self.pid):
            return True
        return now - self.seen_at > STALE_S


class DateInUse(RuntimeError):
    """Another run holds the date (its ``holder``); raised before anything is read or written."""

    def __init__(self, root: str, run_date: str, holder: Holder, path: str, now: float) -> None:
        self.holder, self.path = holder, path
        super().__init__(
            f"another run is writing {root} for {run_date}: {holder.describe(now)}. Two runs of one date "
            f"would do every request twice and could publish a row twice. Wait for it to end "
            f"(`longdoc report {root}` shows it), or run another --date. If that "
            f"run is gone (its machine lost), its lease lapses {STALE_S:g} s after its last renewal, or "
            f"remove {path}")


def _look(fs, path: str) -> tuple[bool, Holder | None]:
    """(whether a lease file is at ``path``, its holder); the holder is None when the file
    is unreadable (torn, empty): such a file holds nothing, and is overwritten."""
    try:
        with fs.open(path, "rb") as fh:
            data = json.loads(fh.read())
        return True, Holder(**{k: data[k] for k in Holder.__dataclass_fields__})
    except FileNotFoundError:
        return False, None
    except (ValueError, KeyError, TypeError):
        return True, None


def _read(fs, path: str) -> Holder | None:
    """The holder of the lease at ``path`` (None: no lease, or an unreadable one)."""
    return _look(fs, path)[1]


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class DateLease:
    """The lease of ``run_date`` under output ``root`` for run ``run_id`` (module docstring).

    ``clock``/``sleep`` are injectable for tests; ``say`` gets one line when acquiring waits
    (watching another host's lease) or takes over a gone run's lease."""

    def __init__(self, root: str, run_date: str, run_id: str, job: str, *,
                 renew_s: float = RENEW_S, stale_s: float = STALE_S, settle_s: float = SETTLE_S,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 say: Callable[[str], None] | None = None) -> None:
        self.root, self.run_date, self.run_id, self.job = root, run_date, run_id, job
        self.uri = lease_path(root, run_date)
        self.fs, self.path = fsspec.core.url_to_fs(self.uri)
        self.renew_s, self.stale_s, self.settle_s = renew_s, stale_s, settle_s
        self.clock, self.sleep, self.say = clock, sleep, say or (lambda _msg: None)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._beat = 0
        self._lost: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking
    def acquire(self) -> None:
        """Take the date, or raise ``DateInUse`` naming the live run that holds it. Returns
        within ``stale_s`` + ``settle_s`` at most (a lease of another host is watched)."""
        while True:
            exists, holder = _look(self.fs, self.path)
            if holder is not None and holder.run_id != self.run_id and self._alive(holder):
                raise DateInUse(self.root, self.run_date, holder, self.uri, self.clock())
            if holder is not None and holder.run_id != self.run_id:
                self.say(f"note: the lease of {self.run_date} was held by a run that is gone "
                         f"({holder.describe(self.clock())}); this run takes the date over")
            if self._take(fresh=not exists):
                break
        self._thread = threading.Thread(target=self._renew_loop, name="longdoc-date-lease", daemon=True)
        self._thread.start()

    def _alive(self, holder: Holder) -> bool:
        """Whether ``holder`` still runs: on this host by its process and this clock; on
        another by watching its ``beat`` for ``stale_s``."""
        if holder.host == self.host:  # one machine, one clock
            return _pid_running(holder.pid) and self.clock() - holder.seen_at < self.stale_s
        self.say(f"note: {holder.describe(self.clock())} holds {self.run_date} of {self.root}; watching "
                 f"up to {self.stale_s:g} s whether it still runs")
        until = self.clock() + self.stale_s
        while self.clock() < until:
            self.sleep(min(1.0, self.renew_s / 4))
            now = _read(self.fs, self.path)
            if now is None or now.run_id != holder.run_id:
                return False  # released (or taken by a third run: the loop reads it again)
            if now.beat != holder.beat:
                return True
        return False

    def _record(self) -> bytes:
        return json.dumps(asdict(Holder(self.run_id, self.job, self.host, self.pid, self._started,
                                        self.clock(), self._beat)), indent=1).encode()

    def _take(self, fresh: bool) -> bool:
        """Write this run's lease and read it back; False when another run's write won."""
        if fresh and is_local(self.fs):
            # A finished file linked in under the lease's name: the link fails if the name
            # exists, so of two runs one wins, and no reader sees a half-written lease.
            folder = os.path.dirname(self.path)
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".lease-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(self._record())
                os.link(tmp, self.path)
            except FileExistsError:
                return False  # another run linked its lease first: look at it again
            finally:
                os.remove(tmp)
            return True
        write_bytes_atomic(self._record(), self.uri)
        self.sleep(self.settle_s)
        now = _read(self.fs, self.path)
        return now is not None and now.run_id == self.run_id

    # ------------------------------------------------------------------ holding
    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Renew the lease once; False (and ``held`` False for good) when another run took it."""
        if self._lost is not None:
            return False
        try:
            now = _read(self.fs, self.path)
            if now is not None and now.run_id != self.run_id:
                self._lost = now
                return False
            self._beat += 1
            write_bytes_atomic(self._record(), self.uri)
        except OSError:
            pass  # storage hiccup: the next renewal tries again (a lease lapses only after stale_s)
        return True

    @property
    def held(self) -> bool:
        """Whether this run still holds the date (False once another run took it over)."""
        return self._lost is None

    @property
    def taken_by(self) -> Holder | None:
        """The run that took the date over from this one (None while ``held``)."""
        return self._lost

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._lost is not None:
            return
        try:
            now = _read(self.fs, self.path)
            if now is not None and now.run_id == self.run_id:
                self.fs.rm(self.path)
        except OSError:
            pass  # the lease lapses by itself after stale_s


def lease_holder(root: str, run_date: str) -> Holder | None:
    """The run holding ``run_date`` of ``root`` by its lease file (None: no lease). Whether
    it still runs is the reader's call (``Holder.gone``)."""
    fs, path = fsspec.core.url_to_fs(lease_path(root, run_date))
    return _read(fs, path)


def live_holder(root: str, run_date: str) -> Holder | None:
    """The run writing ``run_date`` of ``root`` now, by one look at its lease (None: no
    run, or one that is gone); for commands that must not write beside it (`upgrade`,
    `submit`). Storage that cannot be read from here counts as no lease: the run itself
    checks again where it runs."""
    try:
        holder = lease_holder(root, run_date)
    except Exception:  # no credentials or network here: not this command's to judge
        return None
    if holder is None or holder.gone(time.time(), socket.gethostname()):
        return None
    return holder
