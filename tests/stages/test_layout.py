"""Where an output root's files live: the rows in it, everything else beside it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stages.layout import run_record_candidates, run_record_path, runs_root, staging_dir


@pytest.mark.parametrize(("root", "runs"), [
    ("out/sample-summarize", "out/sample-summarize.runs"),
    ("s3://b/out/job/", "s3://b/out/job.runs"),
    ("/data/{x}/job", "/data/{x}/job.runs"),
])
def test_everything_but_the_rows_lives_beside_the_output_root(root, runs):
    """The one seam for where run records (and staged blocks) of an output root live: its
    sibling, so the root itself holds only ``run_date=D/*.parquet``."""
    assert runs_root(root) == runs
    assert run_record_path(root, "2026-01-01", "r1") == f"{runs}/2026-01-01/r1.json"
    assert staging_dir(root, "2026-01-01") == f"{runs}/_staging/2026-01-01"
    # Readers look there first, then where earlier versions wrote (inside the root).
    assert run_record_candidates(root, "2026-01-01", "r1") == [
        f"{runs}/2026-01-01/r1.json", f"{root.rstrip('/')}/_runs/2026-01-01/r1.json"]


def test_the_layout_imports_nothing_heavy():
    """The CLI's preflight uses it before any model or pyarrow loads."""
    code = "import sys, stages.layout; print(sorted(m for m in ('pyarrow', 'numpy', 'fsspec') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
