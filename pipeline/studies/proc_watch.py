"""Watching a process tree through /proc while it runs: the driver's memory (the kernel's
high-water mark, its heap against the pages it maps, a timeline), the whole tree's RSS,
the rows it has staged, and what an earlier run left behind.

/proc is read directly rather than through psutil because the figures the studies need
are /proc's own fields (``VmHWM``, ``RssAnon``, ``RssFile``, ``RssShmem``), which psutil
does not expose; and one scan of /proc/<pid>/stat finds a tree in one pass. Linux only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq


def status_kb(pid: int, key: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmHWM, VmRSS), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            rest = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return None
    if rest[0] == "Z":
        return None  # a zombie holds no memory and runs nothing
    return int(rest[1]), int(rest[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of ``root`` and every live process below it (one /proc scan)."""
    parent: dict[int, int] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None:
                parent[int(entry)], started[int(entry)] = st
    tree, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in started and pid not in tree:
            tree[pid] = started[pid]
            frontier.extend(c for c, p in parent.items() if p == pid)
    return tree


def still_alive(procs: dict[int, int]) -> dict[int, int]:
    """The processes of ``procs`` (pid -> start time) alive now (same pid, same start)."""
    out = {}
    for pid, start in procs.items():
        st = proc_stat(pid)
        if st is not None and st[1] == start:
            out[pid] = start
    return out


TIMELINE_EVERY = 10  # polls between two driver_timeline samples


@dataclass
class Watch:
    """Polls a driver process, its process tree and its staged files until it exits.

    Figures (kB, seconds since ``t0``): ``driver_hwm_kb`` (the kernel's high-water mark
    of the driver), ``driver_anon_peak_kb`` and ``driver_shared_peak_kb`` (the largest
    RssAnon, and RssFile + RssShmem, seen: the driver's own heap against pages it maps,
    such as Ray's object store), ``driver_timeline`` ((t, VmRSS, RssAnon, staged rows) every
    ``TIMELINE_EVERY`` polls: which phase of the run the memory grows in), ``tree_peak_kb`` (the largest per-poll sum of VmRSS over the tree),
    ``tree_procs`` (every process seen in the tree: pid -> start time), the staged rows
    seen over time (``first_rows_t``, ``last_rows_t``, ``staged_rows``), and when the
    processes of ``lingering`` (an earlier run's, pid -> start time) were all gone
    (``lingering_gone_s``).
    """

    pid: int
    staging: Path
    interval_s: float
    t0: float
    driver_hwm_kb: int = 0
    driver_anon_peak_kb: int = 0
    driver_shared_peak_kb: int = 0
    driver_timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    tree_peak_kb: int = 0
    tree_max_procs: int = 0
    tree_procs: dict[int, int] = field(default_factory=dict)
    staged_rows: int = 0
    first_rows_t: float | None = None
    last_rows_t: float | None = None
    first_rows: int = 0
    lingering: dict[int, int] = field(default_factory=dict)
    lingering_gone_s: float | None = None
    _rows_per_file: dict[Path, int] = field(default_factory=dict)
    _polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        hwm = status_kb(self.pid, "VmHWM")
        if hwm is not None:
            self.driver_hwm_kb = max(self.driver_hwm_kb, hwm)
            anon = status_kb(self.pid, "RssAnon") or 0
            self.driver_anon_peak_kb = max(self.driver_anon_peak_kb, anon)
            shared = (status_kb(self.pid, "RssFile") or 0) + (status_kb(self.pid, "RssShmem") or 0)
            self.driver_shared_peak_kb = max(self.driver_shared_peak_kb, shared)
            self._polls += 1
            if self._polls % TIMELINE_EVERY == 1:
                self.driver_timeline.append((round(time.monotonic() - self.t0, 1), status_kb(self.pid, "VmRSS") or 0,
                                             anon, self.staged_rows))
        tree = descendants(self.pid)
        self.tree_procs.update(tree)
        total = sum(status_kb(p, "VmRSS") or 0 for p in tree)
        self.tree_peak_kb = max(self.tree_peak_kb, total)
        self.tree_max_procs = max(self.tree_max_procs, len(tree))
        self.staged_rows = self.count_staged()
        if self.lingering:
            self.lingering = still_alive(self.lingering)
            if not self.lingering:
                self.lingering_gone_s = time.monotonic() - self.t0

    def count_staged(self) -> int:
        """Rows in the staged files now (each file's row count read once, from its footer)."""
        now = time.monotonic() - self.t0
        for path in self.staging.glob("*/*.staged"):
            if path not in self._rows_per_file:
                try:
                    self._rows_per_file[path] = pq.read_metadata(path).num_rows
                except (FileNotFoundError, OSError):
                    continue  # published and removed by the end-of-run commit meanwhile
        rows = sum(self._rows_per_file.values())
        if rows and self.first_rows_t is None:
            self.first_rows_t, self.first_rows = now, rows
        if rows > self.staged_rows:
            self.last_rows_t = now
        return rows

    def until(self, proc: subprocess.Popen, rows: int | None = None) -> bool:
        """Poll until ``proc`` exits (False) or, when ``rows`` is given, until the staged
        files hold at least that many rows (True)."""
        while proc.poll() is None:
            self.poll()
            if rows is not None and self.staged_rows >= rows:
                return True
            self._stop.wait(self.interval_s)
        return False


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def end(procs: dict[int, int]) -> None:
    """SIGKILL processes this tool started that outlived their run (by pid, same start time)."""
    for pid in still_alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
