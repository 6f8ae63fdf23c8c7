"""One side of a bench job measured as a whole process: ``run_measured``.

Contract: ``run_measured(argv, env, cwd, log_path, interval_s, on_tick)`` starts
``argv`` as a fresh process and returns a ``Measured`` once it exits:
- ``wall_s``: seconds from just before the start to its exit (interpreter start, imports,
  Ray start, model load: everything a user waits for); ``t_start``/``t_end`` the same
  instants as wall-clock stamps (``time.time()``, the clock the sides' own stamps use);
- ``peak_rss_bytes``: the largest sum of RSS over the process and all its descendants
  (Ray's GCS, raylet and workers are descendants of `longdoc run`), sampled every
  ``interval_s`` (default 0.25 s); pages shared between processes (Ray's object store,
  libraries) count once per process there, so ``peak_pss_bytes`` (the proportional set
  size, Linux; sampled every ``PSS_EVERY`` ticks because it costs more to read) is the
  fairer figure for a tree of processes;
- ``peak_gpu_bytes``: on a machine with NVIDIA GPUs, the largest device memory in use
  (all processes, NVML or nvidia-smi) minus what was in use before the start; None
  elsewhere;
- ``lines``: every line the process printed (stdout and stderr), each with the
  wall-clock time it arrived (a side's progress lines date its rows); they are also
  written to ``log_path``;
- ``strays``: descendants still alive 30 s after the process exited (then terminated:
  they were ours), which a correct run never leaves.
``on_tick(now)``, when given, is called at every sample (e.g. to watch the files a
side writes). Nothing here kills anything but the processes this call started.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PSS_EVERY = 4  # ticks between PSS reads (reading smaps costs ~ms per process)
STRAY_WAIT_S = 30.0


@dataclass
class Measured:
    argv: list[str]
    returncode: int
    wall_s: float
    t_start: float
    t_end: float
    peak_rss_bytes: int = 0
    peak_pss_bytes: int | None = None
    peak_gpu_bytes: int | None = None
    peak_processes: int = 1
    lines: list[tuple[float, str]] = field(default_factory=list, repr=False)
    strays: list[int] = field(default_factory=list)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


class GpuMemory:
    """Device memory in use on every NVIDIA GPU, through NVML or nvidia-smi; None without GPUs."""

    def __init__(self) -> None:
        self._nvml = None
        self._smi = shutil.which("nvidia-smi")
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._pynvml = pynvml
        except Exception:  # no NVML binding or no driver: fall back to nvidia-smi, or nothing
            self._nvml = None
        self.available = bool(self._nvml) or self._smi is not None

    def used(self) -> int | None:
        if self._nvml:
            return sum(int(self._pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._nvml)
        if self._smi is None:
            return None
        try:
            out = subprocess.run([self._smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5)
            return sum(int(x) for x in out.stdout.split()) * 2**20 if out.returncode == 0 else None
        except (OSError, ValueError, subprocess.SubprocessError):
            return None


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _pump(stream, sink: list[tuple[float, str]], log, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        with lock:
            sink.append((time.time(), line))
            if log is not None:
                log.write(line + "\n")
                log.flush()


def run_measured(
    argv: list[str],
    env: dict[str, str],
    cwd: str | Path,
    log_path: Path | None = None,
    interval_s: float = 0.25,
    on_tick: Callable[[float], None] | None = None,
    timeout_s: float | None = None,
) -> Measured:
    """Start ``argv``, sample it until it exits; see the module contract."""
    gpu = GpuMemory()
    gpu_base = gpu.used() if gpu.available else None
    lines: list[tuple[float, str]] = []
    lock = threading.Lock()
    log = open(log_path, "w") if log_path is not None else None  # noqa: SIM115 - closed below
    t_start = time.time()
    p0 = time.perf_counter()
    popen = subprocess.Popen(argv, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, bufsize=1, errors="replace")
    pumps = [threading.Thread(target=_pump, args=(s, lines, log, lock), daemon=True)
             for s in (popen.stdout, popen.stderr)]
    for t in pumps:
        t.start()
    root = psutil.Process(popen.pid)
    seen: dict[int, psutil.Process] = {}
    m = Measured(argv=list(argv), returncode=-1, wall_s=0.0, t_start=t_start, t_end=t_start)
    tick = 0
    try:
        while True:
            procs = _tree(root)
            rss = pss = 0
            pss_ok = tick % PSS_EVERY == 0
            for p in procs:
                seen.setdefault(p.pid, p)
                try:
                    if pss_ok:
                        full = p.memory_full_info()
                        rss += full.rss
                        pss += getattr(full, "pss", full.rss)
                    else:
                        rss += p.memory_info().rss
                except psutil.Error:  # exited between listing and reading
                    continue
            if procs:
                m.peak_rss_bytes = max(m.peak_rss_bytes, rss)
                m.peak_processes = max(m.peak_processes, len(procs))
                if pss_ok:
                    m.peak_pss_bytes = max(m.peak_pss_bytes or 0, pss)
            if gpu_base is not None and tick % 2 == 0:
                used = gpu.used()
                if used is not None:
                    m.peak_gpu_bytes = max(m.peak_gpu_bytes or 0, used - gpu_base)
            if on_tick is not None:
                on_tick(time.time())
            tick += 1
            try:
                rc = popen.wait(timeout=interval_s)
                break
            except subprocess.TimeoutExpired:
                if timeout_s is not None and time.perf_counter() - p0 > timeout_s:
                    popen.terminate()
                    rc = popen.wait()
                    break
    finally:
        if popen.poll() is None:  # interrupted: stop what we started, descendants first
            for p in [*seen.values(), *_tree(root)][::-1]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            popen.wait()
    m.wall_s = time.perf_counter() - p0
    m.t_end = time.time()
    m.returncode = rc
    for t in pumps:
        t.join(timeout=10)
    if on_tick is not None:
        on_tick(time.time())
    if log is not None:
        log.close()
    m.lines = lines
    alive = [p for pid, p in seen.items() if pid != popen.pid and p.is_running()]
    if alive:
        _, still = psutil.wait_procs(alive, timeout=STRAY_WAIT_S)
        m.strays = [p.pid for p in still]
        for p in still:
            try:
                p.terminate()
            except psutil.Error:
                pass
        psutil.wait_procs(still, timeout=10)
    return m
