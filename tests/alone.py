"""Run a measurement in a fresh interpreter, alone: ``run_alone(script)``.

Why: the memory tests trace allocations with ``tracemalloc``, and on Python 3.11
``tracemalloc.stop()`` races threads that allocate without the GIL (CPython gh-128679, fixed
in 3.12.9 and 3.13.2): in the test process, where earlier tests left engine threads and Ray's
and torch's native threads, the suite died of a segmentation fault there (1 full run in 4).
The child never stops tracing: ``done(value)`` prints the result and leaves with
``os._exit``, so neither ``tracemalloc.stop()`` nor the interpreter's finalisation (which
frees the same tables) runs while a library's thread may still allocate. Its peak is not
blurred by other tests' threads either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Given to every script: report the result and leave at once (see the module's docstring).
_PREAMBLE = """\
import json as _json, os as _os, sys as _sys
def done(value):
    _sys.stdout.write(_json.dumps(value) + "\\n")
    _sys.stdout.flush()
    _os._exit(0)
"""


def run_alone(script: str, timeout_s: float = 120) -> Any:
    """Run ``script`` (Python source, the repository importable, the test process's
    environment) in a new interpreter; it ends by calling ``done(value)`` with a JSON value,
    which is returned. A child that fails raises an AssertionError with its exit status and
    output (faulthandler on, so a crash shows its stack)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _PREAMBLE + textwrap.dedent(script)],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and lines, (f"child exited {p.returncode}\n"
                                         + p.stdout[-2000:] + p.stderr[-3000:])
    return json.loads(lines[-1])
