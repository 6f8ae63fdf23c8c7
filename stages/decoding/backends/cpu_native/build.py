"""Build, cache and load the CPU-native backend's C kernel (attention.c).

Contract: ``load_library(source)`` returns the ``ctypes.CDLL`` of ``source`` compiled by the
system C compiler (``$CC``, else ``cc``; ~0.5 s) with ``FLAGS`` into
``cache_dir()/kernels/<source stem>-<hash>.so``, building it on first use. The hash covers
the source and the headers beside it (``*.h``), the compiler's version, the flags and the
CPU's model and flags. The file is written
under a temporary name and renamed (concurrent actors never load half a file). The
libraries name OpenMP by its soname (libgomp.so.1), which resolves to the copy torch has
loaded: their threads are torch's. Raises RuntimeError (no compiler, a failed build) or
OSError (unloadable). ``choose`` turns that into a decision with a reason: each kernel
module runs its fallback (SDPA, the BLAS, torch's ops) and says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# No -march=native: one binary runs on every CPU of its architecture (a cache shared by
# machines never holds a build another CPU cannot run, and CI on any x86-64 machine runs the
# tests of the same binary); the source compiles its AVX-512 path with a target pragma and
# picks it at run time (attention.c).
FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared")


def cpu_signature() -> str:
    """The CPU's model name and feature flags (part of the cache key: a build is tied to the
    machine that measured and tested it)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def compiler() -> str | None:
    """The C compiler's path (``$CC``, else ``cc``), or None where there is none."""
    return shutil.which(os.environ.get("CC") or "cc")


def _build(cc: str, source: Path, target: Path) -> None:
    """Compile ``source`` into ``target`` (atomically: a temporary file renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        proc = subprocess.run(
            [cc, *FLAGS, "-o", str(tmp), str(source)], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def load_library(source: Path) -> ctypes.CDLL:
    """``source`` compiled into the cache on first use, loaded (see the module contract)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler: set CC or install gcc to build {source.name}")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [p.read_text(encoding="utf-8") for p in [source, *sorted(source.parent.glob("*.h"))]]
    key = hashlib.sha256("\0".join([*texts, version, " ".join(FLAGS), cpu_signature()]).encode()).hexdigest()[:16]
    from stages.cache_paths import cache_dir

    target = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    if not target.is_file():
        _build(cc, source, target)
    return ctypes.CDLL(str(target))


def choose(
    source: Path, instead: str, bind: Callable[[ctypes.CDLL], None],
    on: str = "kernel (AVX-512)", without_avx512: str = "no AVX-512 on this CPU",
) -> tuple[ctypes.CDLL | None, str]:
    """Whether a kernel library runs: ``(library, on)``, or ``(None, "<instead> (why not)")`` when
    there is no compiler, the build or load fails (logged as a warning: the user has a
    compiler and expects the kernel) or the CPU lacks AVX-512 (the library's
    ``ld_fast_path()``). ``bind`` sets the library's ctypes signatures. Called once per
    process (a cached function of the kernel module)."""
    if compiler() is None:
        return None, f"{instead} (no C compiler: set CC or install gcc to build {source.name})"
    try:
        lib = load_library(source)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        log.warning("%s did not build or load: %s", source.name, e)
        return None, f"{instead} ({source.name} did not build or load: {e})"
    lib.ld_fast_path.restype = ctypes.c_int
    bind(lib)
    if not lib.ld_fast_path():
        return None, f"{instead} ({without_avx512})"
    return lib, on


def kernel_functions(
    source: Path, bind: Callable[[ctypes.CDLL], None], instead: str, on: str, without_avx512: str, what: str,
) -> tuple[Callable[[], ctypes.CDLL], Callable[[], tuple[ctypes.CDLL | None, str]]]:
    """A kernel module's two entry points to its library: ``(build_library, kernel_choice)``.

    ``build_library()``: ``source`` compiled into the cache on first use and bound, whatever
    the CPU (the portable path's tests); raises RuntimeError (no compiler, a failed build) or
    OSError (unloadable). ``kernel_choice()``: ``choose``'s decision, made once per process
    (the machine does not change under a running process; ``cache_clear()`` forgets it) and
    logged as ``what``."""

    def build_library() -> ctypes.CDLL:
        lib = load_library(source)
        bind(lib)
        return lib

    @functools.cache
    def kernel_choice() -> tuple[ctypes.CDLL | None, str]:
        choice = choose(source, instead, bind, on=on, without_avx512=without_avx512)
        log.info("%s: %s", what, choice[1])
        return choice

    return build_library, kernel_choice
