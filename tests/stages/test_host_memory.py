"""stages/host_memory.py: freed blocks stay in the process instead of page-faulting back.

The fault counts come from fresh interpreters: the allocator settings are process-wide,
and a test process that already tuned (or fragmented) its heap would hide the difference.
The cases that change nothing run in the test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stages.host_memory import _mallopt, keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]

# Activations of a few sizes allocated, written and freed per pass, as a layer's forward
# does. The probe first pins glibc's mmap threshold at its starting value (128 KiB):
# glibc's own adaptive thresholds depend on the process's history, so this is the
# state every process starts in, made to last; each freed block then goes back to the
# kernel and faults in again, zeroed, on the next pass, unless keep_freed_memory works.
_PROBE = """
import json, os, resource, torch
from stages.host_memory import M_MMAP_THRESHOLD, _mallopt, keep_freed_memory

_mallopt()(M_MMAP_THRESHOLD, 128 << 10)
applied = keep_freed_memory() if os.environ["PROBE_APPLY"] == "1" else None

def faults(passes):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(passes):
        blocks = [torch.empty(n).fill_(1.0) for n in (3 << 20, 1 << 20, 5 << 20, 2 << 20)]
        del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

faults(10)  # the heap grows to its size over the first passes
print(json.dumps({"applied": applied, "faults": faults(20)}))
"""

def _huge_pages_always() -> bool:
    """True where transparent huge pages back every anonymous mapping (fewer, larger faults)."""
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


needs_glibc = pytest.mark.skipif(_mallopt() is None, reason="no glibc mallopt in this C library")


def _probe(apply: bool = True, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LONGDOC_KEEP_FREED_MEMORY")}
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env={**clean, **env, "OMP_NUM_THREADS": "1", "PROBE_APPLY": str(int(apply))},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_freed_activations_are_reused_without_page_faults():
    on, off = _probe(), _probe(apply=False)
    assert on["applied"] and "32 MiB" in on["applied"], on
    # 20 passes of 44 MiB: the control faults every page of every pass back in (about
    # 11,000 4-KiB pages a pass; 22 huge pages where the kernel backs every mapping with
    # them); with freed blocks kept, next to none: at most a pass or two's worth while
    # the heap settles (seen once in a full suite: 5,120 faults, one growth of the heap).
    assert off["faults"] > (400 if _huge_pages_always() else 100_000), off
    assert on["faults"] < off["faults"] / 10, (on, off)


def test_it_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("LONGDOC_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is None


def test_the_users_own_malloc_settings_stand(monkeypatch):
    # glibc read MALLOC_*_ when the process started; mallopt would override the user's choice.
    monkeypatch.delenv("LONGDOC_KEEP_FREED_MEMORY", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() is None
