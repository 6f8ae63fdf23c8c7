"""schemas.errors.format_validation_error: pydantic errors on a job spec as field-named lines."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.errors import MAX_PROBLEMS, format_validation_error
from schemas.spec import JobSpec

MINIMAL = {"name": "nightly", "input": {"uri": "s3://bucket/docs/{run_date}/"}}


def said(data: object, source: str = "job.yaml") -> str:
    with pytest.raises(ValidationError) as e:
        JobSpec.model_validate(data)
    text = format_validation_error(e.value, source)
    assert text.startswith(f"invalid job spec {source}:\n")
    for raw in ("Value error,", "Input should be", "function-after", "[type=", "errors.pydantic.dev"):
        assert raw not in text, text
    return text


def lines(text: str) -> list[str]:
    return text.splitlines()[1:]


def test_an_unknown_key_names_its_path_the_allowed_fields_and_a_suggestion():
    (line,) = lines(said({**MINIMAL, "generation": {"temprature": 0.5}}))
    assert line.startswith("  - generation.temprature: unknown field 'temprature'; allowed: model, ")
    assert line.endswith("(did you mean 'temperature'?)")


def test_an_unknown_key_with_nothing_close_gets_no_suggestion():
    (line,) = lines(said({**MINIMAL, "bogus": 1}))
    assert line == "  - bogus: unknown field 'bogus'; allowed: name, input, task, compression, " \
                   "generation, resources, output, cost"


def test_an_unknown_key_of_a_compression_method_names_the_method():
    (line,) = lines(said({**MINIMAL, "compression": {"method": "truncate", "keeep": "head"}}))
    assert "compression.keeep: unknown field 'keeep' for method 'truncate'" in line
    assert "(did you mean 'keep'?)" in line and "compression.truncate" not in line


def test_a_setting_another_method_takes_says_which_methods_take_it_and_the_fix():
    (line,) = lines(said({**MINIMAL, "compression": {"method": "none", "target_tokens": 5}}))
    assert "compression.target_tokens: method 'none' takes no target_tokens" in line
    assert "truncate" in line and "--set compression.target_tokens=null" in line


def test_a_wrong_type_on_a_bounded_field_says_the_type_and_the_bounds():
    (line,) = lines(said({**MINIMAL, "generation": {"max_new_tokens": "lots"}}))
    assert line == "  - generation.max_new_tokens: got 'lots'; allowed: an integer, >= 1, <= 8192"


def test_a_number_out_of_bounds_says_the_bound():
    (line,) = lines(said({**MINIMAL, "generation": {"max_new_tokens": 0}}))
    assert line == "  - generation.max_new_tokens: got 0; allowed: >= 1"
    (line,) = lines(said({**MINIMAL, "generation": {"top_p": 0}}))
    assert line == "  - generation.top_p: got 0; allowed: > 0.0"


def test_a_wrong_compression_method_lists_every_method():
    (line,) = lines(said({**MINIMAL, "compression": {"method": "zip"}}))
    assert line.startswith("  - compression.method: got 'zip'; allowed: ")
    for method in ("none", "truncate", "finch", "rag", "autocompressor"):
        assert repr(method) in line


@pytest.mark.parametrize("method, hint", [("selct", "select"), ("BM25", "bm25"), ("zip", None)])
def test_a_misspelt_compression_method_gets_a_suggestion(method, hint):
    """A new user's 'selct' was told the list only, where a misspelt field name gets a guess."""
    (line,) = lines(said({**MINIMAL, "compression": {"method": method}}))
    assert line.startswith(f"  - compression.method: got {method!r}; allowed: ")
    assert line.endswith(f" (did you mean {hint!r}?)") if hint else "did you mean" not in line


def test_a_missing_compression_method_is_named_missing():
    (line,) = lines(said({**MINIMAL, "compression": {}}))
    assert line.startswith("  - compression.method: missing; allowed: none")


def test_a_wrong_choice_of_a_literal_lists_the_choices():
    (line,) = lines(said({**MINIMAL, "compression": {"method": "truncate", "keep": "middle"}}))
    assert line == "  - compression.keep: got 'middle'; allowed: 'head', 'tail' or 'head_tail'"


def test_a_scalar_union_is_one_line_with_the_alternatives_merged():
    (line,) = lines(said({**MINIMAL, "resources": {"num_cpus": "all"}}))
    assert line == "  - resources.num_cpus: got 'all'; allowed: 'auto' or a number"
    (line,) = lines(said({**MINIMAL, "resources": {"actors": "many"}}))
    assert line == "  - resources.actors: got 'many'; allowed: an integer or a list"


def test_a_model_validator_field_error_extends_the_path_to_its_field():
    spec = {**MINIMAL, "generation": {"speculative": {"min_ngram": 4, "max_ngram": 2}}}
    (line,) = lines(said(spec))
    assert line == "  - generation.speculative.min_ngram: got 4; allowed: <= max_ngram (2)"


def test_a_missing_field_a_scalar_section_and_a_scalar_spec_are_named():
    assert lines(said({"input": {"uri": "x"}})) == ["  - name: missing; this field is required"]
    assert lines(said({**MINIMAL, "generation": 5})) == [
        "  - generation: got 5; allowed: a mapping of fields (a YAML section)"]
    assert lines(said(5)) == ["  - (top level): got 5; allowed: a mapping of fields (a YAML section)"]


def test_a_list_item_is_named_by_its_index():
    (line,) = lines(said({**MINIMAL, "generation": {"stop": ["ok", ""]}}))
    assert line == "  - generation.stop[1]: got ''; allowed: at least 1 character(s)"


def test_a_huge_bad_value_is_shown_cut_short():
    (line,) = lines(said({**MINIMAL, "generation": {"stop": "x" * 1_000_000}}))
    assert len(line) < 200 and line.endswith("; allowed: a list")


def test_many_problems_are_listed_up_to_the_limit_then_counted():
    text = said({**MINIMAL, "generation": {f"k{i}": 1 for i in range(MAX_PROBLEMS + 5)}})
    listed = lines(text)
    assert len(listed) == MAX_PROBLEMS + 1
    assert listed[-1] == "  ... and 5 more problem(s) not listed; fix these first"
    one_more = lines(said({**MINIMAL, "generation": {f"k{i}": 1 for i in range(MAX_PROBLEMS + 1)}}))
    assert one_more[-1] == "  ... and 1 more problem(s) not listed; fix these first"
