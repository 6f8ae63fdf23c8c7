"""schemas/loading.py at its edges: YAML limits, --set overrides and run values
(tests/schemas/test_spec.py and tests/pipeline/test_cli_refusals.py hold the
refusals as a user meets them)."""

from __future__ import annotations

import pytest

from schemas.loading import (
    MAX_MAPPING_KEYS,
    MAX_SPEC_BYTES,
    SpecError,
    apply_overrides,
    check_run_date,
    load_spec,
    parse_yaml,
)


def test_the_limits_are_inclusive():
    """A mapping of MAX_MAPPING_KEYS keys and a spec file of MAX_SPEC_BYTES bytes are allowed."""
    mapping = parse_yaml("{" + ", ".join(f"k{i}: {i}" for i in range(MAX_MAPPING_KEYS)) + "}")
    assert len(mapping) == MAX_MAPPING_KEYS
    with pytest.raises(SpecError, match="a mapping of"):
        parse_yaml("{" + ", ".join(f"k{i}: {i}" for i in range(MAX_MAPPING_KEYS + 1)) + "}")


def test_a_spec_file_of_the_largest_size_loads(tmp_path):
    text = "name: big\ninput: {uri: /in, format: jsonl}\n"
    path = tmp_path / "job.yaml"
    path.write_text(text + "#" + "x" * (MAX_SPEC_BYTES - len(text) - 2) + "\n")
    assert path.stat().st_size == MAX_SPEC_BYTES
    assert load_spec(path).name == "big"
    path.write_text(path.read_text() + "#\n")
    with pytest.raises(SpecError, match="bytes; allowed: at most"):
        load_spec(path)


def test_an_override_splits_at_its_first_equals_sign_and_may_set_an_empty_text():
    assert apply_overrides({}, ["task.instruction=Answer with a=b."]) == {"task": {"instruction": "Answer with a=b."}}
    assert apply_overrides({}, ["task.instruction="]) == {"task": {"instruction": ""}}


def test_a_run_date_is_written_with_dashes():
    """Python 3.11's date.fromisoformat reads 20260131 too: the spelling is checked first."""
    assert check_run_date("2026-01-31") == "2026-01-31"
    with pytest.raises(SpecError, match="YYYY-MM-DD"):
        check_run_date("20260131")
