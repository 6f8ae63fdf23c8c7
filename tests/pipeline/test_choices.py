"""pipeline/choices.py: fixed-choice options as Enums, so --help lists their values and
typer refuses any other before the command runs (issue 49: `render --kind` and
`bench decode --dtype` showed a bare `<str>`)."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from pipeline.choices import Compile, Dtype, RetryErrors, Runner, choice, spec_choice
from pipeline.cli import app
from schemas.generation_spec import GenerationSpec
from schemas.output import RETRY_POLICIES
from stages.autocompressor.config import AutoCompressorCompression

WIDE = {**os.environ, "COLUMNS": "250"}  # no wrapping inside the help's option table


def test_a_choice_is_a_str_enum_of_its_values_in_order():
    kind = choice("Kind", ("rayjob", "raycronjob"))
    assert [m.value for m in kind] == ["rayjob", "raycronjob"]
    assert kind("rayjob") == "rayjob" and kind("rayjob").value == "rayjob"
    with pytest.raises(ValueError):
        kind("deployment")
    for bad in ((), ("a", "a")):
        with pytest.raises(ValueError, match="distinct values"):
            choice("Bad", bad)


def test_spec_choices_are_the_values_the_spec_allows():
    assert [m.value for m in Dtype] == ["auto", "float32", "bfloat16", "float16"]
    assert {m.value for m in Compile} == set(GenerationSpec.model_fields["compile"].annotation.__args__)
    assert [m.value for m in RetryErrors] == list(RETRY_POLICIES) and [m.value for m in Runner] == ["auto", "ray", "local"]
    # an optional Literal (Literal[...] | None) offers its values
    assert [m.value for m in spec_choice("Form", AutoCompressorCompression, "summary_form")] == ["vectors", "kv"]
    with pytest.raises(ValueError, match="GenerationSpec.max_new_tokens is not a Literal"):
        spec_choice("N", GenerationSpec, "max_new_tokens")


@pytest.mark.parametrize(("command", "listed"), [
    (["run"], ["auto|ray|local", "all|retryable|none"]),
    (["render"], ["rayjob|raycronjob"]),
    (["bench", "decode"], ["cpu|cuda", "auto|float32|bfloat16|float16", "auto|inductor|cudagraphs|off"]),
    (["bench", "compress"], ["sum|kv_group", "heads|paper", "kv|early_exit", "summarize|qa", "calibrated|all"]),
    (["bench", "job"], ["auto|ray|local"]),
    (["train-autocompressor"], ["none|embedding_rms|centered", "vectors|kv", "auto|float32|bfloat16|float16"]),
])
def test_help_lists_the_choices_of_every_fixed_choice_option(command, listed):
    res = CliRunner().invoke(app, [*command, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    for values in listed:
        assert values in res.output, (command, values)


@pytest.mark.parametrize(("command", "option", "bad"), [
    (["render", "jobs/sample-qa.yaml"], "--kind", "deployment"),
    (["bench", "decode"], "--dtype", "int8"),
    (["bench", "decode"], "--device", "tpu"),
])
def test_another_value_is_refused_in_one_line_naming_the_option_and_the_choices(command, option, bad):
    res = CliRunner().invoke(app, [*command, option, bad], env=WIDE)
    assert res.exit_code == 2 and "Traceback" not in res.output
    said = " ".join(res.output.replace("│", " ").split())  # the message as one line, out of its box
    assert f"Invalid value for '{option}'" in said and f"'{bad}' is not one of '" in said
