"""schemas/environment.py: what only the machine that runs a job can know about its spec
(tests/pipeline/test_cli_refusals.py holds the refusals as a user meets them)."""

from __future__ import annotations

from schemas.environment import check_environment
from schemas.loading import spec_from_dict


def test_this_machines_checks_fill_the_run_date_and_tell_a_sibling_from_the_input(tmp_path):
    """A ``{run_date}`` input is looked for once the date is given; an output beside the input
    whose name only starts like it (``in`` and ``in-rows``) is not inside it."""
    dated = spec_from_dict({"name": "j", "input": {"uri": str(tmp_path / "{run_date}"), "format": "text"},
                            "output": {"uri": str(tmp_path / "out")}})
    assert check_environment(dated) == []  # no date: not looked for
    (problem,) = check_environment(dated, run_date="2026-01-31")
    assert problem.startswith("input.uri:") and "2026-01-31' does not exist" in problem
    (tmp_path / "in").mkdir()
    sibling = spec_from_dict({"name": "j", "input": {"uri": str(tmp_path / "in"), "format": "text"},
                              "output": {"uri": str(tmp_path / "in-rows")}})
    assert check_environment(sibling) == []
