"""One run of an output's date at a time: a lease beside the output, held while the run goes.

Why: two runs of one date (a nightly schedule that fires while last night's run is still
going, a second `longdoc run` by hand, `submit --suffix` while the first job runs) would
each do every request (twice the bill), the second would publish the first's staged
blocks at its start (stages/partition.py publishes a crashed run's), and two commits at
once can publish a request twice.

The lease is ``{root}.runs/_leases/{run_date}.json`` (stages/layout.py ``lease_path``): it
names the process that holds the date (run id, job, host, machine = host name + boot +
process namespace, process id and start time, a random ``token`` of the process) and
``beat``, a counter with the holder's clock at its last renewal (``seen_at``). A daemon
thread renews it every ``renew_s``. How a date is held depends on the storage:

- **A local (or mounted) folder:** the date is held by an exclusive kernel lock
  (``flock``) on ``{lease}.lock``, taken without waiting and kept until the process ends:
  the kernel releases it when the holder dies, however it dies, and a stopped or hung
  holder keeps it (on one machine a live process is never taken over: the refusal names
  its pid). The JSON only describes the holder. A filesystem without locks takes the
  object store's way.
- **An object store (and such filesystems):** no lock that every fsspec store honours, so
  the runs agree through the JSON. A free date is taken by a create-if-absent write where
  the store has one (S3's If-None-Match), else a write and a read back after
  ``settle_s``. A lease of a process on this machine is alive while its process is
  (its pid and start time); another machine's, or a lease this version cannot read, is
  watched for ``stale_s``: bytes changing = alive (two machines' clocks are never
  compared here); a lease that changes hands meanwhile is judged again. A takeover writes
  only over the lease it judged gone. A mount whose kernel locks hold on one machine only
  (NFS ``nolock``, some FUSE mounts) is judged the same way once the lock is granted, when
  the lease names another machine. Left open, named: two runs taking over the same gone
  lease within milliseconds of each other may both succeed (the loser finds out at its next
  renewal and stops, but both may have published the gone run's staged rows at their
  start); and a holder on another machine paused for over ``stale_s`` while it writes one
  file of its publish (the publish confirms the lease before each file, stages/partition.py
  ``commit_date``'s ``check``, not during one).

While the run goes, a renewal that finds another process's lease marks the lease ``lost``
(the runner stops at its next block). ``confirm`` (a renewal now) decides whether the run
may publish: not lost, and a renewal succeeded within ``stale_s / 2``. A run that may not
publish leaves its rows staged. ``release`` removes the lease if it is still this
process's, never raises, and never waits long on a hung mount.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

import fsspec

from stages.layout import lease_path
from stages.links import refuse_links
from stages.write import is_local, write_bytes_atomic

#: `longdoc run`'s exit status when another run holds the date: EX_TEMPFAIL (sysexits.h),
#: "try again later", which a scheduler can tell from a failed run (1) or a bad spec (2).
DATE_IN_USE_EXIT = 75
#: Seconds between renewals while a run holds its date.
RENEW_S = 10.0
#: A lease of another machine not renewed for this long belongs to a run that is gone.
STALE_S = 30.0
#: Seconds between a taking write and its read back (object stores without conditional writes).
SETTLE_S = 1.0
#: Commands that look once (report, submit) and cannot watch: another machine's lease is
#: taken for gone only this long after its renewal by this clock (clocks differ).
FOREIGN_STALE_S = 600.0
LEASE_VERSION = 1
# flock failing because this filesystem has no locks (not because another process holds it).
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}
# os.link failing for want of hard links (some FUSE mounts), not because the name exists.
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


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot; tells a reused pid apart), or
    None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _process_alive(pid: int, start: int | None) -> bool:
    """Whether process ``pid`` (started at ``start``, when known) runs on this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return start is None or _process_start(pid) in (None, start)


@dataclass(frozen=True)
class Holder:
    """What the lease file says of the process holding a date."""

    run_id: str
    job: str = "?"
    host: str = "?"
    machine: str = "?"
    pid: int = 0
    pid_start: int | None = None
    token: str = ""
    started_at: str = "?"  # ISO 8601, UTC
    seen_at: float = 0.0  # the holder's clock (time.time()) at its last renewal
    beat: int = 0  # renewals so far
    version: int = LEASE_VERSION

    def here(self) -> bool:
        """Whether the holder runs on this machine (its process can be asked)."""
        return self.machine == machine_id()

    def state(self, now: float) -> str:
        """One look's verdict: "ended" (on this machine its process has ended; another
        machine's has not renewed for ``FOREIGN_STALE_S`` by this clock: a live run is never
        judged gone for a clock's skew), "stalled" (on this machine its process is there but
        has not renewed for ``STALE_S``: stopped or hung) or "running"."""
        if not self.here():
            return "ended" if now - self.seen_at > FOREIGN_STALE_S else "running"
        if not _process_alive(self.pid, self.pid_start):
            return "ended"
        return "stalled" if now - self.seen_at > STALE_S else "running"

    def describe(self, now: float) -> str:
        if self.here():
            renewed = f"last renewed {max(0, round(now - self.seen_at))} s ago"
        else:
            at = datetime.fromtimestamp(self.seen_at, timezone.utc).isoformat(timespec="seconds")
            renewed = f"last renewed at {at} by that machine's clock"
        return f"run {self.run_id} of job {self.job!r} on host {self.host} (pid {self.pid}), started {self.started_at}, {renewed}"


class DateInUse(RuntimeError):
    """Another run holds the date (its ``holder``, None when its lease cannot be read);
    raised before this run publishes anything."""

    def __init__(self, root: str, run_date: str, holder: Holder | None, path: str, now: float) -> None:
        self.holder, self.path = holder, path
        if holder is None:
            who, then = f"a run whose lease this longdoc cannot read yet ({path})", ""
        else:
            who = holder.describe(now)
            then = (f" It has not renewed its lease for a while: if its process is stopped or hung, end it "
                    f"(pid {holder.pid} on {holder.host}) and run the date again." if holder.state(now) == "stalled"
                    else "")
        super().__init__(
            f"another run is writing {root} for {run_date}: {who}. One run of a date at a time: two would do "
            f"every request twice and could publish a row twice. Wait for it to end (`longdoc report {root}` "
            f"shows it), or run another --date.{then}")


class LinkedLease(ValueError):
    """The date's lock file, its lease folder or the output's ``.runs`` folder is a symbolic
    link: refused, never followed. Whoever can write to the output's folders could otherwise
    make a run (perhaps root's) create or lock a file anywhere (a security review planted
    one). A bad setup: ``run`` exits 2."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is a symbolic link: longdoc does not follow links to its leases (someone who "
                         f"can write there could point it at any file); remove it (rm '{path}') and check who "
                         "else can write to the output's folders")


def _parse(raw: bytes) -> Holder | None:
    """The holder a lease's bytes name; None when they cannot be read (torn, another format)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            return None
        holder = Holder(**{k: data[k] for k in Holder.__dataclass_fields__ if k in data})
        start = None if holder.pid_start is None else int(holder.pid_start)
        return replace(holder, run_id=str(holder.run_id), job=str(holder.job), host=str(holder.host),
                       machine=str(holder.machine), token=str(holder.token), started_at=str(holder.started_at),
                       pid=int(holder.pid), pid_start=start, seen_at=float(holder.seen_at), beat=int(holder.beat))
    except (ValueError, TypeError):
        return None


def _look(fs, path: str) -> tuple[bytes | None, Holder | None]:
    """(the lease's bytes, None when there is none; its holder, None when unreadable)."""
    try:
        with fs.open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None, None
    return raw, _parse(raw)


def _create_local(path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; False if it does. A
    finished file is linked in under the name (the link fails if the name exists, and no
    reader sees half a lease); a filesystem without hard links gets an exclusive create."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".lease-")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # readable by the other users of a shared output
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in _NO_LINKS:
                raise
        try:
            with open(path, "xb") as fh:
                fh.write(data)
            return True
        except FileExistsError:
            return False
    finally:
        os.remove(tmp)


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _gone_note(holder: Holder | None, now: float) -> str:
    """What a run taking a date over says of the holder it judged gone."""
    if holder is None:
        return "the date's lease could not be read and did not change while watched"
    return f"the date was held by a run that is gone ({holder.describe(now)})"


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
        self._pid_start = _process_start(os.getpid())
        self._beat = 0
        self._renewed_at = 0.0  # monotonic time of the last successful write
        self._lock_fd: int | None = None  # the kernel lock of a local date, held until release
        self._lost: Holder | None = None
        self._lost_why: str | None = None
        self._released = False
        self._lock = threading.Lock()  # a renewal's write and release's removal never interleave
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ taking
    def acquire(self) -> None:
        """Take the date, or raise ``DateInUse`` naming the live run that holds it. A local
        date answers at once; an object store's takes ``stale_s`` per watch of another
        machine's lease."""
        if not (is_local(self.fs) and self._lock_local()):
            self._acquire_shared()
        self._thread = threading.Thread(target=self._renew_loop, name="longdoc-date-lease", daemon=True)
        self._thread.start()

    def _lock_local(self) -> bool:
        """Hold the date by the kernel lock of ``{lease}.lock`` and describe this process in
        the lease; False when this filesystem has no locks (the caller takes the object
        store's way). Raises ``DateInUse`` when another process holds the lock."""
        leases = os.path.dirname(self.path)
        for folder in (os.path.dirname(leases), leases):  # {output}.runs and its _leases
            if os.path.islink(folder):
                raise LinkedLease(folder)
        # The rest of the date's tree too (its partition, staging, ledger, records, marks):
        # whoever takes this lease writes there next (stages/links.py).
        refuse_links(self.root, self.run_date)
        os.makedirs(leases, exist_ok=True)
        lock = f"{self.path}.lock"
        try:  # the umask applies; never through a link (LinkedLease)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LinkedLease(lock) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DateInUse(self.root, self.run_date, _look(self.fs, self.path)[1], self.uri, self.clock()) from None
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return False
            raise
        try:
            raw, holder = _look(self.fs, self.path)
            # A lease of another machine (or unreadable) under a lock this kernel granted: the
            # mount's locks may be this machine's only (NFS `nolock`, some FUSE mounts), so the
            # lease is judged as on an object store before it is written over.
            if raw is not None and (holder is None or not holder.here()):
                if self._judge(raw, holder) != "gone":
                    raise DateInUse(self.root, self.run_date, _look(self.fs, self.path)[1], self.uri, self.clock())
            if holder is not None and holder.token != self.token:
                self.say(f"note: {_gone_note(holder, self.clock())}; this run takes {self.run_date} over")
            if raw is None:
                if not _create_local(self.path, self._record()):  # another machine's run, this instant
                    raise DateInUse(self.root, self.run_date, _look(self.fs, self.path)[1], self.uri, self.clock())
            elif _look(self.fs, self.path)[0] != raw:
                raise DateInUse(self.root, self.run_date, _look(self.fs, self.path)[1], self.uri, self.clock())
            else:
                write_bytes_atomic(self._record(), self.uri)
        except BaseException:
            os.close(fd)  # not held after all: an in-process caller (eval) may try the date again
            raise
        self._lock_fd = fd
        self._renewed_at = self.monotonic()
        return True

    def _acquire_shared(self) -> None:
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
                return

    def _judge(self, raw: bytes, holder: Holder | None) -> str:
        """"alive", "gone" or "changed" (another readable lease replaced it: judge again)."""
        if holder is not None and holder.here():  # its process says, stopped or not
            return "alive" if _process_alive(holder.pid, holder.pid_start) else "gone"
        who = holder.describe(self.clock()) if holder is not None else "a lease this longdoc cannot read"
        self.say(f"note: {who} holds {self.run_date} of {self.root}; watching up to {self.stale_s:g} s "
                 "whether it still runs")
        until = self.monotonic() + self.stale_s
        while True:
            now_raw, now = _look(self.fs, self.path)
            if now_raw != raw:
                if now_raw is None:
                    return "changed"  # released: the date is free
                # Renewed (the same process), or an unreadable lease that moves: alive.
                if holder is None or (now is not None and now.token == holder.token):
                    return "alive"
                return "changed"
            if self.monotonic() >= until:
                return "gone"
            self.sleep(min(1.0, self.renew_s / 4))

    def _record(self) -> bytes:
        h = Holder(self.run_id, self.job, socket.gethostname(), machine_id(), os.getpid(), self._pid_start,
                   self.token, self._started, self.clock(), self._beat)
        return json.dumps(asdict(h), indent=1).encode()

    def _take(self, expect: bytes | None) -> bool:
        """Write this process's lease where ``expect`` was (None: no lease) and read it back;
        False when the lease is no longer ``expect`` or another process's write won."""
        if _look(self.fs, self.path)[0] != expect:
            return False  # it changed since it was judged: judge again
        if expect is not None:
            self.fs.rm(self.path)  # then taken like a free date (a racing taker's create fails)
        if is_local(self.fs):  # a folder without kernel locks
            if not _create_local(self.path, self._record()):
                return False
        else:
            try:
                self.fs.pipe_file(self.path, self._record(), mode="create")  # S3: If-None-Match
            except FileExistsError:
                return False
            except (TypeError, NotImplementedError, ValueError):  # a store without conditional writes
                write_bytes_atomic(self._record(), self.uri)
            except OSError as e:  # 409/412 from a store that words it otherwise; 501: no such writes
                if e.errno != errno.ENOSYS and _look(self.fs, self.path)[0] is not None:
                    return False
                if e.errno != errno.ENOSYS:
                    raise
                write_bytes_atomic(self._record(), self.uri)
        self.sleep(self.settle_s)
        now = _look(self.fs, self.path)[1]
        if now is None or now.token != self.token:
            return False
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
        if not self._lock.acquire(timeout=self.renew_s):
            return True  # a renewal hangs on the storage: this one is skipped
        try:
            if self._lost_why is not None or self._released:
                return False
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
        finally:
            self._lock.release()
        return True

    @property
    def lost(self) -> bool:
        """Whether a renewal found another process's lease (for good): the run stops at its
        next block and publishes nothing."""
        return self._lost_why is not None

    def confirm(self) -> bool:
        """Renew now and say whether this process may publish: not ``lost``, and a renewal
        succeeded within ``stale_s / 2`` (longer, and others may judge it gone)."""
        self.renew()
        return not self.lost and self.monotonic() - self._renewed_at < self.stale_s / 2

    def ensure(self) -> None:
        """``confirm``, or raise ``DateInUse`` naming the taker (before a publish)."""
        if not self.confirm():
            raise DateInUse(self.root, self.run_date, self._lost, self.uri, self.clock())

    @property
    def lost_reason(self) -> str:
        """Why the run may not publish (``lost``, or ``confirm`` False), for its record."""
        if self._lost_why is not None:
            return self._lost_why
        return f"its lease could not be renewed for {self.monotonic() - self._renewed_at:.0f} s (storage unreachable?)"

    @property
    def taken_by(self) -> Holder | None:
        """The process that took the date over (None unless ``lost``, or when unreadable)."""
        return self._lost

    def release(self) -> None:
        """Stop renewing, remove the lease if it is still this process's, drop the kernel
        lock; never raises (a lease left behind is judged by its holder's process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_s + 5)
        got = self._lock.acquire(timeout=5)
        try:
            self._released = True
            if got and self._lost_why is None:
                now = _look(self.fs, self.path)[1]
                if now is not None and now.token == self.token:
                    self.fs.rm(self.path)
        except Exception:  # noqa: BLE001
            pass
        finally:
            if got:
                self._lock.release()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # the kernel lock goes with it
                self._lock_fd = None


def lease_holder(root: str, run_date: str) -> Holder | None:
    """The process holding ``run_date`` of ``root`` by its lease file (None: no lease, or
    one this version cannot read). Whether it still runs: ``Holder.state``."""
    fs, path = fsspec.core.url_to_fs(lease_path(root, run_date))
    return _look(fs, path)[1]


def live_holder(root: str, run_date: str) -> Holder | None:
    """The run writing ``run_date`` of ``root`` now, by one look at its lease (None: no
    run, or one that has ended); for `submit`, which must not start a second run. Storage
    that cannot be read from here counts as no lease: the run checks again where it runs."""
    try:
        holder = lease_holder(root, run_date)
    except Exception:  # noqa: BLE001 - no credentials or network here: not this command's to judge
        return None
    if holder is None or holder.state(time.time()) == "ended":
        return None
    return holder
