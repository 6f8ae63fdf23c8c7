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
