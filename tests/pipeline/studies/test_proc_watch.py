"""pipeline/studies/proc_watch.py on a real process tree: a shell with a child of its own,
a staged file appearing while it runs, and the tree killed at the end."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.studies.proc_watch import Watch, comm, descendants, end, still_alive


def test_a_tree_is_found_watched_and_ended(tmp_path):
    staging = tmp_path / "staging"
    (staging / "run-1").mkdir(parents=True)
    # A parent that stays a shell (two commands) and a python child that holds ~50 MB.
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'b = bytearray(50 << 20); import time; "
                             "time.sleep(60)' & sleep 60; wait"])
    try:
        deadline = time.monotonic() + 20
        while len(descendants(proc.pid)) < 3 and time.monotonic() < deadline:  # sh, python, sleep
            time.sleep(0.05)
        tree = descendants(proc.pid)
        assert proc.pid in tree and len(tree) == 3, tree
        assert {comm(p) for p in tree} >= {"sh", "sleep"}
        watch = Watch(pid=proc.pid, staging=staging, interval_s=0.05, t0=time.monotonic())
        time.sleep(1.0)  # the child has touched its 50 MB
        watch.poll()
        assert watch.driver_hwm_kb > 0 and watch.tree_max_procs == 3
        assert watch.tree_peak_kb > 50 * 1024  # the child's bytes count in the tree, not in the driver
        assert watch.staged_rows == 0 and watch.first_rows_t is None
        pq.write_table(pa.table({"x": list(range(7))}), staging / "run-1" / "part-0.staged")
        watch.poll()
        assert watch.staged_rows == 7 and watch.first_rows == 7 and watch.first_rows_t is not None
        assert watch.driver_timeline and watch.driver_timeline[0][3] == 0  # sampled on the first poll
        end(tree)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while still_alive(tree) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert still_alive(tree) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
