"""Paths of the clone's own data, found from any folder (pipeline/bundled.py)."""

from __future__ import annotations

from pathlib import Path

from pipeline.bundled import ROOT, bundled


def test_a_default_under_jobs_is_found_from_another_folder_and_a_users_own_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bundled("jobs/corpus") == str(ROOT / "jobs" / "corpus") and Path(bundled("jobs/corpus")).is_dir()
    (tmp_path / "jobs" / "corpus").mkdir(parents=True)  # the user's own folder of that name
    assert bundled("jobs/corpus") == "jobs/corpus"
    assert bundled("jobs/no-such-folder") == "jobs/no-such-folder"  # its reader says it is missing
    assert bundled(str(tmp_path)) == str(tmp_path)
