"""A side measured as a whole process: its tree's peak memory, its dated lines, no strays."""

from __future__ import annotations

import os
import sys

from pipeline.bench.job_measure import run_measured

# The child starts a grandchild that holds 200 MiB (touched) until the test releases it
# through a FIFO, after the sampler has seen it: no sleeps.
_GRANDCHILD = """
import sys
held = b"\\x01" * (200 << 20)
open(sys.argv[1], "w").close()        # ready
with open(sys.argv[2]) as f:          # blocks until the test writes
    f.read()
print("grandchild done", len(held), flush=True)
"""
_CHILD = """
import subprocess, sys
print("child start", flush=True)
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], check=True)
print("child end", flush=True)
sys.exit(3)
"""


def test_tree_peak_lines_and_exit_code(tmp_path):
    ready, release = tmp_path / "ready", tmp_path / "release"
    os.mkfifo(release)
    seen_after_ready = 0

    def on_tick(_now: float) -> None:
        nonlocal seen_after_ready
        if ready.exists():
            seen_after_ready += 1
            if seen_after_ready == 2:  # one full sample taken while the memory was held
                with open(release, "w") as f:
                    f.write("go")

    m = run_measured([sys.executable, "-c", _CHILD, _GRANDCHILD, str(ready), str(release)], dict(os.environ),
                     tmp_path, tmp_path / "log.txt", interval_s=0.05, on_tick=on_tick)
    assert m.returncode == 3
    assert m.peak_rss_bytes > 200 * 2**20 and m.peak_processes >= 2
    assert m.peak_pss_bytes is not None and m.peak_pss_bytes > 0
    texts = [line for _, line in m.lines]
    assert texts == ["child start", f"grandchild done {200 << 20}", "child end"]
    stamps = [t for t, _ in m.lines]
    assert m.t_start <= stamps[0] <= stamps[1] <= stamps[2] <= m.t_end
    assert 0 < m.wall_s <= m.t_end - m.t_start + 0.01
    assert m.strays == [] and (tmp_path / "log.txt").read_text().splitlines() == texts
