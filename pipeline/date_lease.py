"""One run of an output's date at a time: a lease file beside the output, renewed while
the run goes.

Why: two runs of one date (a nightly schedule that fires while last night's run is still
going, a second `longdoc run` by hand, `submit --suffix` while the first job runs) would
each do every request (twice the bill), the second would publish the first's staged
blocks at its start (stages/partition.py publishes a crashed run's), and two commits at
once can publish a request twice. Storage offers no lock that every fsspec filesystem
honours, so the runs agree through a file:

- ``{root}.runs/_leases/{run_date}.json`` (stages/layout.py ``lease_path``) names the
  process that holds the date: its run id, job, host, machine (host name, boot and process
  namespace: two containers may share a host name), process id, a random ``token`` of the
  process (ownership: a second process resuming the same run id is another holder), and
  ``beat``, a counter with the holder's clock at its last renewal (``seen_at``).
- ``DateLease.acquire`` takes the date when no lease is there, or when its holder is gone:
  on this machine its process has ended, or it has not renewed for ``stale_s`` (one
  machine, one clock); another machine's holder, or a lease this version cannot read, is
  watched for ``stale_s`` (its bytes changing = alive; two machines' clocks are never
  compared here). A holder that is alive gets ``DateInUse`` raised, naming it. A lease
  that changes hands while it is watched is judged again from the start.
- Taking is a write, then a read back after ``settle_s`` (of two runs that take at once,
  the one whose write landed last holds the date; the other reads the winner back and
  judges it). A takeover writes only if the lease is still the one judged gone. On a local
  disk a free date is taken by an exclusive link (a filesystem without hard links, e.g.
  some FUSE mounts, takes the write and read-back path).
- While the run goes a daemon thread renews the lease every ``renew_s``; a renewal that
  finds another process's lease there marks the lease ``lost`` and the runner stops at its
  next block. ``confirm`` (a renewal now) decides whether the run may publish: not lost, and
  a renewal succeeded within ``stale_s / 2`` (storage unreachable longer: others may soon
  judge this run gone). A run that may not publish leaves its rows staged for the holder.
  ``release`` removes the lease if it is still this process's, and never raises.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
import threading
import time
import uuid
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
#: Commands that look once (report, upgrade, submit) and cannot watch: another machine's
#: lease is taken for gone only this long after its renewal by this clock (clocks differ).
FOREIGN_STALE_S = 600.0
LEASE_VERSION = 1
# os.link failing for want of hard links, not because the lease exists.
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EACCES}


def machine_id() -> str:
    """This machine as a lease names it: host name, boot id and process namespace (two
    containers with one host name, e.g. host networking, have different namespaces)."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            parts.append(fh.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:  # not Linux: the host name alone
        pass
    return "/".join(parts)


@dataclass(frozen=True)
class Holder:
    """What the lease file says of the process holding a date."""

    run_id: str
    job: str = "?"
    host: str = "?"
    machine: str = "?"
    pid: int = 0
    token: str = ""
    started_at: str = "?"  # ISO 8601, UTC
    seen_at: float = 0.0  # the holder's clock (time.time()) at its last renewal
    beat: int = 0  # renewals so far
    version: int = LEASE_VERSION

    def here(self) -> bool:
        """Whether the holder runs on this machine (its process and clock can be asked)."""
        return self.machine == machine_id()

    def state(self, now: float) -> str:
        """One look's verdict (for commands that cannot watch): "ended" (on this machine its
        process has ended; another machine's has not renewed for ``FOREIGN_STALE_S`` by this
        clock: a live run is never judged gone for a clock's skew), "stalled" (on this machine
        its process is there but has not renewed for ``STALE_S``: stopped or hung; the next
        run of the date takes it over) or "running"."""
        if not self.here():
            return "ended" if now - self.seen_at > FOREIGN_STALE_S else "running"
        if not _pid_running(self.pid):
            return "ended"
        return "stalled" if now - self.seen_at > STALE_S else "running"

    def gone(self, now: float) -> bool:
        """Whether the next run of the date may take it over (``state`` not "running")."""
        return self.state(now) != "running"

    def describe(self, now: float) -> str:
        if self.here():
            renewed = f"last renewed {max(0, round(now - self.seen_at))} s ago"
        else:
            at = datetime.fromtimestamp(self.seen_at, timezone.utc).isoformat(timespec="seconds")
            renewed = f"last renewed at {at} by that machine's clock"
        return f"run {self.run_id} of job {self.job!r} on host {self.host} (pid {self.pid}), started {self.started_at}, {renewed}"


class DateInUse(RuntimeError):
    """Another run holds the date (its ``holder``); raised before anything is published."""

    def __init__(self, root: str, run_date: str, holder: Holder | None, path: str, now: float) -> None:
        self.holder, self.path = holder, path
        who = holder.describe(now) if holder is not None else f"a run whose lease this longdoc cannot read ({path})"
        stop = (f"If it is stuck, stop it (pid {holder.pid} on {holder.host}); once it has ended a rerun takes the "
                f"date (within {STALE_S:g} s)." if holder is not None else "")
        super().__init__(
            f"another run is writing {root} for {run_date}: {who}. One run of a date at a time: two would "
            f"do every request twice and could publish a row twice. Wait for it to end (`longdoc report "
            f"{root}` shows it), or run another --date. {stop}".rstrip())


def _gone_note(holder: Holder | None, now: float) -> str:
    """What a run that takes a date over says of its holder."""
    if holder is None:
        return "the date's lease could not be read and did not change while watched"
    if holder.state(now) == "stalled":
        return (f"{holder.describe(now)}: its process is still there but stopped renewing (stopped or hung?); "
                "if it wakes it stops and publishes nothing")
    return f"the date was held by a run that is gone ({holder.describe(now)})"


def _parse(raw: bytes) -> Holder | None:
    """The holder a lease's bytes name; None when they cannot be read (torn, another format)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            return None
        fields = {k: data[k] for k in Holder.__dataclass_fields__ if k in data}
        holder = Holder(**fields)
        float(holder.seen_at), int(holder.pid), int(holder.beat)  # noqa: B018 - types checked
        return holder
    except (ValueError, TypeError):
        return None


def _look(fs, path: str) -> tuple[bytes | None, Holder | None]:
    """(the lease's bytes, None when there is no lease; its holder, None when unreadable)."""
    try:
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None, None
    return raw, _parse(raw)


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class DateLease:
    """The lease of ``run_date`` under output ``root`` for this process's run ``run_id``
    (module docstring). ``clock`` (wall, written in the lease), ``monotonic`` (durations)
    and ``sleep`` are injectable for tests; ``say`` gets one line when acquiring watches
    another machine's lease or takes over a gone run's."""

    def __init__(self, root: str, run_date: str, run_id: str, job: str, *,
                 renew_s: float = RENEW_S, stale_s: float = STALE_S, settle_s: float = SETTLE_S,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] | None = None) -> None:
        self.root, self.run_date, self.run_id, self.job = root, run_date, run_id, job
        self.uri = lease_path(root, run_date)
        self.fs, self.path = fsspec.core.url_to_fs(self.uri)
        self.renew_s, self.stale_s, self.settle_s = renew_s, stale_s, settle_s
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep
        self.say = say or (lambda _msg: None)
        self.token = uuid.uuid4().hex
        self._started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._beat = 0
        self._renewed_at = 0.0  # monotonic time of the last successful write
        self._lost: Holder | None = None
        self._lost_why: str | None = None
        self._released = False
        self._lock = threading.Lock()  # a renewal's write and release's removal never interleave
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking
    def acquire(self) -> None:
        """Take the date, or raise ``DateInUse`` naming the live run that holds it. Takes
        ``stale_s`` per watch of another machine's lease (a lease changing hands meanwhile
        is judged again)."""
        while True:
            raw, holder = _look(self.fs, self.path)
            if raw is not None:
                verdict = self._judge(raw, holder)
                if verdict == "changed":
                    continue
                if verdict == "alive":
                    raise DateInUse(self.root, self.run_date, holder, self.uri, self.clock())
                self.say(f"note: {_gone_note(holder, self.clock())}; this run takes {self.run_date} over")
            if self._take(expect=raw):
                break
        self._thread = threading.Thread(target=self._renew_loop, name="longdoc-date-lease", daemon=True)
        self._thread.start()

    def _judge(self, raw: bytes, holder: Holder | None) -> str:
        """"alive", "gone" or "changed" (the lease changed hands while watched: judge again)."""
        if holder is not None and holder.here():  # one machine, one clock
            alive = _pid_running(holder.pid) and self.clock() - holder.seen_at < self.stale_s
            return "alive" if alive else "gone"
        who = holder.describe(self.clock()) if holder is not None else "a lease this longdoc cannot read"
        self.say(f"note: {who} holds {self.run_date} of {self.root}; watching up to {self.stale_s:g} s "
                 "whether it still runs")
        until = self.monotonic() + self.stale_s
        while True:
            now_raw, now = _look(self.fs, self.path)
            if now_raw != raw:
                same = holder is not None and now is not None and now.token == holder.token
                return "alive" if same else "changed"
            if self.monotonic() >= until:
                return "gone"
            self.sleep(min(1.0, self.renew_s / 4))

    def _record(self) -> bytes:
        h = Holder(self.run_id, self.job, socket.gethostname(), machine_id(), os.getpid(), self.token,
                   self._started, self.clock(), self._beat)
        return json.dumps(asdict(h), indent=1).encode()

    def _take(self, expect: bytes | None) -> bool:
        """Write this process's lease over ``expect`` (None: no lease) and read it back;
        False when the lease is no longer ``expect`` or another process's write won."""
        if expect is None and is_local(self.fs):
            linked = self._link()
            if linked is not None:
                return linked
        if _look(self.fs, self.path)[0] != expect:
            return False  # it changed since it was judged: judge again
        write_bytes_atomic(self._record(), self.uri)
        self.sleep(self.settle_s)
        now = _look(self.fs, self.path)[1]
        if now is None or now.token != self.token:
            return False
        self._renewed_at = self.monotonic()
        return True

    def _link(self) -> bool | None:
        """A free local date taken by linking a finished file in under the lease's name (the
        link fails if the name exists: one of two runs wins, and no reader sees half a
        lease). None: this filesystem has no hard links."""
        folder = os.path.dirname(self.path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".lease-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self._record())
            os.link(tmp, self.path)
        except FileExistsError:
            return False  # another run linked its lease first: judge it
        except OSError as e:
            if e.errno in _NO_LINKS:
                return None
            raise
        finally:
            os.remove(tmp)
        self._renewed_at = self.monotonic()
        return True

    # ------------------------------------------------------------------ holding
    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Renew the lease once; False (and ``lost`` for good) once another process's lease
        is there. A storage error is not a loss: the next renewal tries again (``confirm``
        refuses to publish if none succeeds for ``stale_s / 2``)."""
        with self._lock:
            if self._lost is not None or self._lost_why is not None or self._released:
                return False
            try:
                raw, now = _look(self.fs, self.path)
                if raw is not None and (now is None or now.token != self.token):
                    self._lost = now
                    self._lost_why = (f"{now.describe(self.clock())} took the date over" if now is not None
                                      else "its lease was replaced by one this longdoc cannot read")
                    return False
                self._beat += 1
                write_bytes_atomic(self._record(), self.uri)
                self._renewed_at = self.monotonic()
            except Exception:  # noqa: BLE001 - storage or credentials: retried at the next renewal
                pass
            return True

    @property
    def lost(self) -> bool:
        """Whether a renewal found another process's lease (for good): the run stops at its
        next block."""
        return self._lost_why is not None

    def confirm(self) -> bool:
        """Renew now and say whether this process may publish: no other lease seen, and a
        renewal succeeded within ``stale_s / 2`` (past that, others may soon judge it gone)."""
        self.renew()
        return not self.lost and self.monotonic() - self._renewed_at < self.stale_s / 2

    @property
    def lost_reason(self) -> str:
        """Why the run may not publish (``lost``, or ``confirm`` False), for its record and the console."""
        if self._lost_why is not None:
            return self._lost_why
        return f"its lease could not be renewed for {self.monotonic() - self._renewed_at:.0f} s (storage unreachable?)"

    @property
    def taken_by(self) -> Holder | None:
        """The process that took the date over (None unless ``lost``, or when unreadable)."""
        return self._lost

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this process's; never raises
        (a lease left behind lapses after ``stale_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_s + 5)
        with self._lock:
            self._released = True
            try:
                now = _look(self.fs, self.path)[1]
                if now is not None and now.token == self.token:
                    self.fs.rm(self.path)
            except Exception:  # noqa: BLE001 - the lease lapses by itself
                pass


def lease_holder(root: str, run_date: str) -> Holder | None:
    """The process holding ``run_date`` of ``root`` by its lease file (None: no lease, or
    one this version cannot read). Whether it still runs: ``Holder.gone``."""
    fs, path = fsspec.core.url_to_fs(lease_path(root, run_date))
    return _look(fs, path)[1]


def live_holder(root: str, run_date: str) -> Holder | None:
    """The run writing ``run_date`` of ``root`` now, by one look at its lease (None: no
    run, or one that is gone); for `submit`, which must not start a second run. Storage
    that cannot be read from here counts as no lease: the run checks again where it runs."""
    try:
        holder = lease_holder(root, run_date)
    except Exception:  # noqa: BLE001 - no credentials or network here: not this command's to judge
        return None
    if holder is None or holder.gone(time.time()):
        return None
    return holder
