"""`longdoc report` (pipeline/report/command.py): a root without output is refused in one
line naming the near miss (tests of what it prints: test_load.py, test_answers.py)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.report.command import report
from stages.partition import commit_date
from tests.pipeline.report.test_load import _rows, _stage


def test_a_root_without_output_names_the_folder_to_pass(tmp_path):
    root = str(tmp_path / "out")
    _stage(root, _rows("r1", "2026-01-01", 2))
    commit_date(root, "2026-01-01", "r1")
    assert json.loads(CliRunner().invoke(app, ["report", root, "--json"]).output)[0]["rows"] == 2
    text = CliRunner().invoke(app, ["report", root]).output
    assert "== j 2026-01-01 (r1) ==" in text  # the job's name first
    # ... then what the run read with (the rows' model and method; the budget from its record)
    lines = {ln.rsplit("  ", 1)[0].strip(): ln.rsplit("  ", 1)[1].strip() for ln in text.splitlines()[1:4]}
    assert lines["model"] == "embedded:smollm2-135m-instruct" and lines["compression"] == "none", lines
    for path, hint in ((tmp_path / "none", "it does not exist"), (tmp_path, f"one level below it: {root}"),
                       (tmp_path / "out" / "run_date=2026-01-01", f"pass the output root above it ({root})")):
        res = CliRunner().invoke(app, ["report", str(path)])
        assert res.exit_code == 2 and hint in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert report.__doc__ and "Summarise" in report.__doc__  # the command `longdoc report` registers


def test_a_date_linked_into_the_output_is_named_as_skipped(tmp_path):
    """Scans skip links inside an output (stages/links.py): a date archived to another disk and
    linked back would vanish from the report without a word; the report names it."""
    root = str(tmp_path / "out")
    for date in ("2026-01-01", "2026-01-02"):
        _stage(root, _rows("r1", date, 2))
        commit_date(root, date, "r1")
    archive = tmp_path / "archive" / "run_date=2026-01-02"
    archive.parent.mkdir()
    (tmp_path / "out" / "run_date=2026-01-02").rename(archive)
    (tmp_path / "out" / "run_date=2026-01-02").symlink_to(archive)
    res = CliRunner().invoke(app, ["report", root])
    assert res.exit_code == 0, res.output
    assert "2026-01-02" not in res.output.split("note:")[0]  # its rows are in no figure
    assert (f"note: 1 link(s) inside the output were skipped, their rows counted nowhere above (the first: "
            f"{root}/run_date=2026-01-02 -> {archive})") in res.output
    assert "fix: move the files into the output in place of the link" in res.output
    assert "1 link(s) inside the output were skipped" in CliRunner().invoke(app, ["report", root, "--dates"]).output
    (tmp_path / "out" / "run_date=2026-01-02").unlink()
    assert "link(s) inside the output" not in CliRunner().invoke(app, ["report", root]).output
