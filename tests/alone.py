"""Run a measurement in a fresh interpreter, alone: ``run_alone(script)``.

Why: the memory tests trace allocations with ``tracemalloc``, and on Python 3.11
``tracemalloc.stop()`` races threads that allocate without the GIL (CPython gh-128679, fixed
in 3.12.9 and 3.13.2): in the test process, where earlier tests left engine threads, Ray's
and torch's native threads, the suite once died of a segmentation fault there. A child
with no other threads cannot race, and its peak is not blurred by theirs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_alone(script: str, timeout_s: float = 120) -> Any:
    """Run ``script`` (Python source; the repository importable) in a new interpreter and
    return the JSON value of its last line of output; an AssertionError with its output
    when it fails."""
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout_s, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
