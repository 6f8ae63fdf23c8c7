"""Ray's log-deduplication hint (a sentence with a URL, printed once after the first
"[repeated Nx across cluster]" line) is off unless Ray's logs are wanted (--verbose);
the deduplication itself stays on (pipeline/progress.py, quiet_python_loggers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A driver as `longdoc run` sets it up, then Ray's own deduplicator (the one that rewrites
# worker lines on the driver's console) fed the same line from two workers, three times.
_DRIVER = """
import json
from pipeline.ray_console import quiet_python_loggers
from ray._private.ray_logging import LogDeduplicator

quiet_python_loggers()
dedup = LogDeduplicator(5, None, None, _timesource=lambda: 0.0)
printed = []
for pid in (101, 102, 101, 102):
    for out in dedup.deduplicate({"ip": "10.0.0.1", "pid": pid, "lines": ["loading the model"]}):
        printed += out["lines"]
for out in dedup.flush():
    printed += out["lines"]
print(json.dumps(printed))
"""


def _console_lines(verbose: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "LONGDOC_RAY_LOGS"}
    if verbose:
        env["LONGDOC_RAY_LOGS"] = "1"
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _DRIVER], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("verbose", [False, True])
def test_the_dedup_hint_only_with_verbose(verbose: bool) -> None:
    lines = _console_lines(verbose)
    assert lines[0] == "loading the model"
    repeated = [ln for ln in lines if "[repeated 3x across cluster]" in ln]
    assert len(repeated) == 1, lines  # deduplication stays on either way
    assert ("RAY_DEDUP_LOGS=0" in repeated[0] and "https://" in repeated[0]) is verbose, repeated
