"""schemas.generation_spec: generation, speculation and resources settings: defaults and refusals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.generation_spec import (
    MAX_ACTORS,
    GenerationSpec,
    ResourcesSpec,
    SpeculativeSpec,
    speculative_methods,
)
from schemas.spec_base import EMBEDDED_EMBEDDER, EMBEDDED_MODEL, RANDOM_MODEL_SHAPES


def refusal(spec_model: type, **fields) -> str:
    with pytest.raises(ValidationError) as e:
        spec_model(**fields)
    return str(e.value)


def test_generation_defaults_are_greedy_on_the_embedded_model_with_prompt_lookup():
    g = GenerationSpec()
    assert g.model == EMBEDDED_MODEL and g.temperature == 0.0 and g.top_p == 1.0 and g.top_k == 0
    assert (g.dtype, g.compile, g.prefix_cache, g.stop, g.repeat_guard) == ("auto", "auto", "auto", (), 0)
    assert g.speculative.method == "prompt_lookup" and g.speculative.adaptive


@pytest.mark.parametrize("field, ok, bad", [
    ("temperature", [0.0, 5.0], [-0.1, 5.01]),
    ("top_p", [1e-6, 1.0], [0.0, 1.01]),
    ("top_k", [0, 100_000], [-1, 100_001]),
    ("max_new_tokens", [1, 8192], [0, 8193]),
    ("repeat_guard", [0, 64], [-1, 65]),
])
def test_decoding_numbers_are_bounded_at_both_ends(field, ok, bad):
    for value in ok:
        assert getattr(GenerationSpec(**{field: value}), field) == value
    for value in bad:
        assert field in refusal(GenerationSpec, **{field: value})


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_temperature_is_refused(value):
    assert "finite number" in refusal(GenerationSpec, temperature=value)


def test_dtype_and_compile_accept_only_their_choices():
    assert GenerationSpec(dtype="bfloat16").dtype == "bfloat16"
    assert "'float32', 'bfloat16' or 'float16'" in refusal(GenerationSpec, dtype="fp8")
    assert "cudagraphs" in refusal(GenerationSpec, compile="yes")


def test_yaml_booleans_for_compile_and_prefix_cache_read_as_on_and_off():
    assert GenerationSpec(compile=False).compile == "off"
    assert GenerationSpec(prefix_cache=True).prefix_cache == "on"
    assert GenerationSpec(prefix_cache=False).prefix_cache == "off"
    assert "compile" in refusal(GenerationSpec, compile=True)  # `compile: on` is no choice


def test_stop_strings_are_kept_and_an_empty_one_is_refused():
    assert GenerationSpec(stop=["\n\n", "END"]).stop == ("\n\n", "END")
    assert "at least 1 character" in refusal(GenerationSpec, stop=["END", ""])


@pytest.mark.parametrize("shape", RANDOM_MODEL_SHAPES)
def test_random_models_of_known_shapes_and_hub_ids_are_accepted(shape):
    assert GenerationSpec(model=f"random:{shape}").model == f"random:{shape}"
    assert GenerationSpec(model="Qwen/Qwen2-0.5B").model == "Qwen/Qwen2-0.5B"


@pytest.mark.parametrize("model, expected", [
    ("random:huge", "unknown random model 'random:huge'; allowed: random:tiny"),
    ("  ", f"is empty; allowed: {EMBEDDED_MODEL}"),
    (EMBEDDED_EMBEDDER, f"unknown embedded name '{EMBEDDED_EMBEDDER}'; allowed: {EMBEDDED_MODEL}"),
])
def test_a_bad_model_name_is_refused_saying_what_is_allowed(model, expected):
    assert expected in refusal(GenerationSpec, model=model)


def test_speculative_methods_are_none_and_the_drafters_and_others_are_refused():
    methods = speculative_methods()
    assert "none" in methods and "prompt_lookup" in methods
    for m in methods:
        assert SpeculativeSpec(method=m).method == m
    said = refusal(SpeculativeSpec, method="magic")
    assert "unknown speculative method 'magic'; allowed: " + ", ".join(methods) in said


def test_min_ngram_above_max_ngram_is_refused_naming_min_ngram():
    assert SpeculativeSpec(min_ngram=3, max_ngram=3).min_ngram == 3
    assert "min_ngram: got 4; allowed: <= max_ngram (2)" in refusal(SpeculativeSpec, min_ngram=4, max_ngram=2)
    assert "num_draft_tokens" in refusal(SpeculativeSpec, num_draft_tokens=65)


def test_resources_defaults_are_one_actor_and_auto_cpus():
    r = ResourcesSpec()
    assert (r.actors, r.max_actors, r.num_cpus, r.decode_slots) == (1, 1, "auto", "auto")
    assert r.kv_memory_gb is None and r.kv_memory_fraction is None and r.custom_resources == {}


def test_actors_take_a_count_or_a_min_max_range_within_bounds():
    assert ResourcesSpec(actors=[2, 5]).max_actors == 5
    assert ResourcesSpec(actors=MAX_ACTORS).max_actors == MAX_ACTORS
    assert f"allowed: 1 to {MAX_ACTORS}, or [min, max]" in refusal(ResourcesSpec, actors=0)
    for bad in ([3, 1], [0, 2], [1, MAX_ACTORS + 1]):
        assert f"needs 1 <= min <= max <= {MAX_ACTORS}, got {bad}" in refusal(ResourcesSpec, actors=bad)


def test_cpus_per_actor_shares_the_machine_among_engines_with_at_least_one_core():
    auto = ResourcesSpec()
    assert auto.cpus_per_actor(8, 1) == 8.0 and auto.cpus_per_actor(7, 2) == 3.0
    assert auto.cpus_per_actor(2, 4) == 1.0 and auto.cpus_per_actor(8, 0) == 8.0
    assert auto.cpus_per_actor(None, 3) == 1.0  # a Ray cluster: its nodes are unknown here
    fixed = ResourcesSpec(num_cpus=2.5)
    assert fixed.cpus_per_actor(64, 1) == 2.5 and fixed.cpus_per_actor(None, 8) == 2.5


@pytest.mark.parametrize("fields, field", [
    ({"kv_memory_gb": 0}, "kv_memory_gb"), ({"kv_memory_gb": float("inf")}, "kv_memory_gb"),
    ({"kv_memory_fraction": 0.96}, "kv_memory_fraction"), ({"num_cpus": 0}, "num_cpus"),
    ({"num_cpus": "all"}, "num_cpus"), ({"decode_slots": 257}, "decode_slots"),
    ({"batch_size": 0}, "batch_size"), ({"max_retries": 101}, "max_retries"),
    ({"custom_resources": {"": 1}}, "custom_resources"), ({"custom_resources": {"pool": 0}}, "custom_resources"),
    ({"schedule_timeout_s": 0}, "schedule_timeout_s"), ({"num_gpus": 65}, "num_gpus"),
])
def test_bad_resource_values_are_refused_naming_the_field(fields, field):
    assert field in refusal(ResourcesSpec, **fields)


def test_a_boolean_custom_resource_amount_is_refused():
    assert "custom_resources" in refusal(ResourcesSpec, custom_resources={"gpu_pool": True})
