"""decode_config_for: the one mapping of a spec's generation settings to a DecodeConfig,
EOS ids collected from the tokenizer and the model's generation_config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from schemas.spec import GenerationSpec
from stages.decoding.config import decode_config_for, eos_ids_of
from stages.prompting import PLAIN_PROMPT_STOPS

TOK = SimpleNamespace(eos_token_id=2, chat_template="{{ messages }}")  # a chat model's tokenizer


@pytest.mark.parametrize(
    ("gen_eos", "expected"),
    [(None, {2}), (2, {2}), (7, {2, 7}), ([2, 7, 9], {2, 7, 9}), ((11,), {2, 11})],
)
def test_eos_ids_from_tokenizer_and_generation_config(gen_eos, expected) -> None:
    assert eos_ids_of(TOK, SimpleNamespace(eos_token_id=gen_eos)) == frozenset(expected)
    assert eos_ids_of(SimpleNamespace(eos_token_id=None), None) == frozenset()


def test_every_generation_setting_is_mapped() -> None:
    gen = GenerationSpec(
        max_new_tokens=33, temperature=0.7, top_p=0.9, stop=("END",),
        speculative={"method": "prompt_lookup", "num_draft_tokens": 5, "max_ngram": 4, "min_ngram": 2, "adaptive": False},
    )  # fmt: skip
    cfg = decode_config_for(gen, TOK, SimpleNamespace(eos_token_id=[2, 8]))
    assert (cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.stop_strings) == (33, 0.7, 0.9, ("END",))
    assert (cfg.speculative, cfg.num_draft_tokens, cfg.max_ngram, cfg.min_ngram, cfg.adaptive) == (
        "prompt_lookup", 5, 4, 2, False,
    )  # fmt: skip
    assert cfg.eos_ids == frozenset({2, 8}) and not cfg.greedy
    plain = decode_config_for(GenerationSpec(speculative={"method": "none"}), TOK)
    assert plain.speculative == "none" and plain.greedy and plain.eos_ids == frozenset({2})


def test_a_model_without_a_chat_template_stops_where_it_starts_the_plain_prompts_next_label() -> None:
    """The plain prompt ends "Question: ...\n\nAnswer:"; a base model that has answered
    writes the next "Question:" (Gemma 3 270M did, every row)."""
    base = SimpleNamespace(eos_token_id=2, chat_template=None)
    cfg = decode_config_for(GenerationSpec(stop=("END", "\nQuestion:")), base)
    assert cfg.stop_strings == ("END", "\nQuestion:", "\nAnswer:", "\nDocument:")
    assert set(PLAIN_PROMPT_STOPS) <= set(cfg.stop_strings)
    assert decode_config_for(GenerationSpec(), TOK).stop_strings == ()  # a chat template: its own end-of-turn
