"""schemas.spec_base: embedded model names and the strict base model every spec section uses."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field, ValidationError

from schemas.spec_base import (
    EMBEDDED_EMBEDDER,
    EMBEDDED_MODEL,
    EMBEDDED_NAMES,
    INT64_MAX,
    _Strict,
    check_embedded_name,
)


class Section(_Strict):
    """A spec section of every kind of field the base model treats specially."""

    count: Annotated[int, Field(ge=1)] = 1
    seed: int = 0
    ratio: float = 0.5
    pair: tuple[int, int] = (1, 2)
    cpus: Literal["auto"] | float = "auto"
    flag: bool = False
    label: str = "a"


def refusal(**fields) -> str:
    with pytest.raises(ValidationError) as e:
        Section(**fields)
    return str(e.value)


@pytest.mark.parametrize("field, name", [(f, n) for f, names in EMBEDDED_NAMES.items() for n in names])
def test_each_field_accepts_the_embedded_names_it_ships(field, name):
    assert check_embedded_name(name, field) == name


def test_names_that_are_not_embedded_pass_through():
    assert check_embedded_name("Qwen/Qwen2-0.5B", "model") == "Qwen/Qwen2-0.5B"
    assert check_embedded_name("./models/mine", "embedder") == "./models/mine"


def test_an_embedded_name_of_another_field_is_refused_listing_this_fields_names():
    with pytest.raises(ValueError) as e:
        check_embedded_name(EMBEDDED_EMBEDDER, "model")
    assert str(e.value) == (f"unknown embedded name '{EMBEDDED_EMBEDDER}'; allowed: {EMBEDDED_MODEL} "
                            "(or a Hugging Face id / local path)")
    with pytest.raises(ValueError, match=f"allowed: {EMBEDDED_EMBEDDER} "):
        check_embedded_name(EMBEDDED_MODEL, "embedder")


def test_a_field_that_ships_no_embedded_name_says_none():
    with pytest.raises(ValueError, match="allowed: none for this field"):
        check_embedded_name("embedded:anything", "tokenizer")


def test_a_huge_embedded_name_is_shown_cut_short():
    with pytest.raises(ValueError) as e:
        check_embedded_name("embedded:" + "x" * 100_000, "model")
    assert len(str(e.value)) < 300


def test_unknown_keys_are_refused():
    assert "Extra inputs are not permitted" in refusal(colour="red")


def test_a_section_is_frozen():
    s = Section()
    with pytest.raises(ValidationError):
        s.count = 2  # type: ignore[misc]
    assert s.count == 1


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_refused(value):
    assert "finite number" in refusal(ratio=value)


@pytest.mark.parametrize("fields, expected", [
    ({"count": True}, "count: got True"), ({"ratio": False}, "ratio: got False"),
    ({"pair": [1, True]}, "pair[1]: got True"), ({"cpus": True}, "cpus: got True"),
])
def test_true_or_false_where_a_number_is_asked_for_is_refused_naming_the_item(fields, expected):
    said = refusal(**fields)
    assert expected in said
    assert "allowed: a number (true/false is not one)" in said


def test_booleans_and_strings_are_left_to_their_own_fields():
    assert Section(flag=True).flag is True
    assert "label" in refusal(label=True)


def test_integers_beyond_64_bits_are_refused_with_the_fields_own_lower_bound():
    assert Section(seed=INT64_MAX).seed == INT64_MAX
    assert f"seed: got {INT64_MAX + 1}; allowed: >= {-INT64_MAX - 1}, <= {INT64_MAX} (64 bits)" \
        in refusal(seed=INT64_MAX + 1)
    assert f"count: got an integer of 201 bits; allowed: >= 1, <= {INT64_MAX} (64 bits)" \
        in refusal(count=2**200)
    assert "pair[0]: got" in refusal(pair=[2**64, 1])


def test_the_smallest_64_bit_integer_is_accepted():
    assert Section(seed=-INT64_MAX - 1).seed == -INT64_MAX - 1
