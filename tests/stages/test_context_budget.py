"""Budgets that can never fit the model's context are found from configs, not weights."""

from __future__ import annotations

import json

import pytest

from schemas.spec import EMBEDDED_MODEL, JobSpec
from stages.context_budget import (
    _frame_exact,
    budget_problems,
    frame_tokens_from_files,
    model_context,
)
from stages.prompting import PromptBuilder


def _spec(tmp_path, **parts) -> JobSpec:
    data = {"name": "b", "input": {"uri": str(tmp_path / "in")}, "output": {"uri": str(tmp_path / "out")}}
    data.update(parts)
    return JobSpec.model_validate(data)


def test_model_context_from_configs_only(tiny_model_dir, tokenizer):
    from stages.model_loading import embedded_model_dir

    converted = json.loads((embedded_model_dir() / "config.json").read_text())
    assert model_context(EMBEDDED_MODEL) == converted["max_position_embeddings"] == 8192
    from stages.context_budget import EMBEDDED_SHAPE

    assert EMBEDDED_SHAPE == {k: converted[k] for k in EMBEDDED_SHAPE}  # the memory checks' shape
    assert model_context("random:tiny") == 8192
    assert model_context("random:nope") is None  # the spec refuses the shape elsewhere
    saved = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    assert model_context(str(tiny_model_dir)) == saved
    assert model_context("no-such-org/no-such-model") is None  # not cached: no check, no download


@pytest.mark.parametrize("kind,question", [("summarize", None), ("qa", "Who built the bridge in 1887?")])
def test_fast_frame_count_agrees_with_the_prompt_builder(tokenizer, tiny_model_dir, kind, question):
    from stages.model_loading import embedded_tokenizer_dir

    spec_instruction = "Answer briefly." if kind == "qa" else "Summarize."
    want = PromptBuilder(tokenizer).overhead_tokens(spec_instruction, question)
    assert frame_tokens_from_files(embedded_tokenizer_dir(), spec_instruction, question) == want
    assert frame_tokens_from_files(tiny_model_dir, spec_instruction, question) == want


def test_the_largest_value_named_fits_and_one_more_does_not(tmp_path, tokenizer):
    spec = _spec(tmp_path, compression={"method": "truncate", "target_tokens": 1_000_000})
    (problem,) = budget_problems(spec)
    frame = _frame_exact(spec, EMBEDDED_MODEL)
    largest = 8192 - frame - spec.generation.max_new_tokens
    assert problem.startswith("compression.target_tokens: got 1000000")
    assert f"allowed: at most {largest}," in problem
    assert budget_problems(_spec(tmp_path, compression={"method": "truncate", "target_tokens": largest})) == []
    assert budget_problems(_spec(tmp_path, compression={"method": "truncate", "target_tokens": largest + 1}))


def test_each_method_declares_what_it_holds(tmp_path, tokenizer):
    frame = _frame_exact(_spec(tmp_path), EMBEDDED_MODEL)
    # finch reads chunk_tokens next to the kept tokens (no answer yet): that bound is tighter.
    fits = 8192 - frame - 512
    finch = {"method": "finch", "target_tokens": fits, "chunk_tokens": 512}
    assert budget_problems(_spec(tmp_path, compression=finch)) == []
    (problem,) = budget_problems(_spec(tmp_path, compression={**finch, "target_tokens": fits + 1}))
    assert "compression.chunk_tokens" in problem and f"at most {fits}," in problem
    # rag, bm25: the kept context with the answer.
    for method in ("rag", "bm25"):
        (problem,) = budget_problems(_spec(tmp_path, compression={"method": method, "target_tokens": 9000}))
        assert problem.startswith("compression.target_tokens: got 9000")
    # autocompressor: target_tokens caps what is read and compressed, never held whole.
    assert budget_problems(_spec(tmp_path, compression={"method": "autocompressor", "target_tokens": 10**6})) == []
    # none: the answer itself must leave room for the prompt and one document token.
    (problem,) = budget_problems(_spec(tmp_path, generation={"max_new_tokens": 8192}))
    assert problem.startswith("generation.max_new_tokens: got 8192")
    assert f"at most {8192 - frame - 1}," in problem


def test_defaults_need_no_tokenizer(tmp_path, monkeypatch):
    import stages.context_budget as cb

    def loaded(*a, **k):
        raise AssertionError("a budget far from the context loaded the tokenizer")

    monkeypatch.setattr(cb, "_frame_exact", loaded)
    for compression in ({"method": "none"}, {"method": "truncate"}, {"method": "finch"}, {"method": "rag"}):
        assert budget_problems(_spec(tmp_path, compression=compression)) == []
    assert budget_problems(_spec(tmp_path, generation={"model": "random:llama-8b", "max_new_tokens": 4096})) == []


def test_unknown_context_is_not_checked(tmp_path):
    spec = _spec(tmp_path, generation={"model": "no-such-org/no-such-model"},
                 compression={"method": "truncate", "target_tokens": 10**6})
    assert budget_problems(spec) == []


def test_run_job_refuses_before_reading_anything(tmp_path):
    from pipeline.runner import run_job

    spec = _spec(tmp_path, compression={"method": "truncate", "target_tokens": 10**6})  # the input is absent
    with pytest.raises(ValueError, match=r"compression.target_tokens: got 1000000.*allowed: at most"):
        run_job(spec, run_date="2026-01-31", progress=False)
    assert not (tmp_path / "out").exists()


def test_model_parameters_read_a_local_folders_config(tiny_model_dir):
    """The memory check (pipeline/preflight.py) weighs a local model from its config.json."""
    from types import SimpleNamespace

    from stages.context_budget import model_parameters
    from stages.model_size import estimate_parameters

    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert model_parameters(str(tiny_model_dir)) == estimate_parameters(SimpleNamespace(**config)) > 0
    assert model_parameters(str(tiny_model_dir / "nowhere")) is None
    from stages.context_budget import model_kv_bytes

    layers, kv_heads = config["num_hidden_layers"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    assert model_kv_bytes(str(tiny_model_dir), 2) == layers * kv_heads * head_dim * 2 * 2
