"""stages/links.py: every link a run of a date would follow below a local output root is
found (with where it points); the output root itself may be a link; an object store is
asked nothing. The runs that meet these links are in tests/pipeline/test_date_lease.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stages.links import LinkedOutput, planted_links, refuse_links

DATE = "2026-05-01"
# Every folder or file of DATE a run reads, writes, renames or deletes by name, relative to
# the output root's parent (``out`` is the root): stages/layout.py, stages/ledger.py, stages/completion.py.
NAMED = [
    "out.runs", f"out.runs/{DATE}", "out.runs/_staging", f"out.runs/_staging/{DATE}", "out.runs/_ledger",
    f"out.runs/_ledger/{DATE}", "out.runs/_complete", f"out.runs/_complete/{DATE}.parquet", "out.runs/_scratch",
    "out.runs/_leases", f"out/run_date={DATE}", "out/_runs", f"out/_runs/{DATE}", "out/_staging",
    f"out/_staging/{DATE}", "out/_ledger", f"out/_ledger/{DATE}",
]


@pytest.mark.parametrize("rel", NAMED)
def test_a_link_at_any_named_path_of_the_date_is_found_with_its_target(tmp_path, rel):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    assert planted_links(str(tmp_path / "out"), DATE) == [(str(link), str(elsewhere))]
    with pytest.raises(LinkedOutput) as e:
        refuse_links(str(tmp_path / "out"), DATE)
    assert f"{link} is a symbolic link (to {elsewhere})" in str(e.value)
    assert f"rm '{link}'" in str(e.value) and "point output.uri at the real folder" in str(e.value)
    # Another date's run does not meet a link of this date's own folders.
    if DATE in rel:
        assert planted_links(str(tmp_path / "out"), "2026-05-02") == []


@pytest.mark.parametrize("folder", [f"out/run_date={DATE}", f"out.runs/_staging/{DATE}"])
def test_a_link_among_the_partition_or_staging_entries_is_found(tmp_path, folder):
    """A file link in the partition (another output's rows taken as the date's), or a run's
    staging folder planted ahead of it (its blocks would be staged outside, never published)."""
    (tmp_path / folder).mkdir(parents=True)
    (tmp_path / folder / "real.parquet").write_bytes(b"PAR1")
    target = tmp_path / "elsewhere.parquet"
    target.write_bytes(b"PAR1")
    (tmp_path / folder / "planted").symlink_to(target)
    assert planted_links(str(tmp_path / "out"), DATE) == [(str(tmp_path / folder / "planted"), str(target))]


def test_an_output_root_that_is_a_link_is_legitimate(tmp_path):
    """A user may link the output folder to a bigger disk: only what lies below it counts."""
    real = tmp_path / "bigdisk" / "out"
    (real / f"run_date={DATE}").mkdir(parents=True)
    (tmp_path / "out").symlink_to(real)
    (tmp_path / "out.runs" / "_staging" / DATE).mkdir(parents=True)
    assert planted_links(str(tmp_path / "out"), DATE) == []
    assert planted_links(f"file://{tmp_path}/out/", DATE) == []
    refuse_links(str(tmp_path / "out"), DATE)  # no raise
    # ... and a link below the linked root is still found, through the file:// form too.
    (real / f"run_date={DATE}" / "x.parquet").symlink_to(tmp_path / "x.parquet")
    assert [p for p, _ in planted_links(f"file://{tmp_path}/out", DATE)] == [f"{tmp_path}/out/run_date={DATE}/x.parquet"]


def test_an_object_store_root_is_asked_nothing(tmp_path, monkeypatch):
    """No links there: not a call (a listing per run would slow every run down)."""
    def refuse(*args, **kwargs):
        raise AssertionError("an object store's output root was looked at")

    monkeypatch.setattr(os, "scandir", refuse)
    monkeypatch.setattr(os.path, "islink", refuse)
    assert planted_links("s3://bucket/out", DATE) == []
    assert planted_links("gs://bucket/jobs/out", DATE) == []


def test_no_output_yet_has_no_links(tmp_path):
    assert planted_links(str(tmp_path / "never" / "out"), DATE) == []
    Path(tmp_path / "out.runs").mkdir()
    assert planted_links(str(tmp_path / "out"), DATE) == []


@pytest.mark.parametrize("spelling", ["~/out", "file://~/out"])
def test_a_root_under_the_home_folder_is_checked_where_it_is_written(tmp_path, monkeypatch, spelling):
    """``~/out`` is the home's out folder to fsspec, which writes there: the check looks there
    too (it looked for a folder named ``~`` and found nothing to refuse)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "home" / "out" / f"run_date={DATE}"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    assert planted_links(spelling, DATE) == [(str(link), str(elsewhere))]


def test_every_link_is_named_at_once_but_none_through_a_linked_folder(tmp_path):
    """A linked fixed folder and a file link in the partition: both named (one round of fixes),
    while the entries of a linked staging folder (the link's target's) are not listed."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "inner").mkdir(parents=True)
    (elsewhere / "x.parquet").symlink_to(elsewhere / "inner")  # would be listed if followed
    complete = tmp_path / "out.runs" / "_complete"
    complete.parent.mkdir(parents=True)
    complete.symlink_to(elsewhere)
    staging = tmp_path / "out.runs" / "_staging"
    staging.mkdir()
    (staging / DATE).symlink_to(elsewhere)
    part = tmp_path / "out" / f"run_date={DATE}"
    part.mkdir(parents=True)
    (part / "planted.parquet").symlink_to(tmp_path / "elsewhere" / "inner")
    assert sorted(planted_links(str(tmp_path / "out"), DATE)) == sorted([
        (str(staging / DATE), str(elsewhere)), (str(complete), str(elsewhere)),
        (str(part / "planted.parquet"), str(tmp_path / "elsewhere" / "inner"))])


def test_the_links_a_whole_output_scan_skips_are_listed(tmp_path):
    """For `longdoc report` to name: a date folder that is a link, and links inside the others."""
    from stages.links import skipped_links

    root = tmp_path / "out"
    (root / f"run_date={DATE}").mkdir(parents=True)
    (root / f"run_date={DATE}" / "real.parquet").write_bytes(b"PAR1")
    target = tmp_path / "elsewhere.parquet"
    target.write_bytes(b"PAR1")
    (root / f"run_date={DATE}" / "planted.parquet").symlink_to(target)
    (tmp_path / "archive").mkdir()
    (root / "run_date=2026-04-30").symlink_to(tmp_path / "archive")
    assert skipped_links(str(root)) == [(str(root / "run_date=2026-04-30"), str(tmp_path / "archive")),
                                        (str(root / f"run_date={DATE}" / "planted.parquet"), str(target))]
    assert skipped_links(str(tmp_path / "missing")) == [] and skipped_links("s3://bucket/out") == []
