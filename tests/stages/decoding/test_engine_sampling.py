"""Speculative sampling follows the model's distribution exactly (statistical test).

A tiny Llama with a 16-token vocabulary makes the exact distribution of the first
generated tokens computable by enumeration (fixtures in conftest.py). Thousands of
requests with the same prompt and different seeds are decoded by the engine with
prompt lookup forced on; the frequencies of the 2nd and 3rd tokens (drafted, accepted
or corrected) are compared with the exact marginals by a chi-square test. The same
test must reject a wrong acceptance rule, which shows it has the power to catch one.
"""

from __future__ import annotations

import torch
from sampling_stats import ROWS, TEMP, TOP_P, chi2_excess, second_third_counts

from stages.decoding import verify
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.request import Request
from stages.decoding.state import CompressedPrefill, prefill_full
from stages.prompting import PromptParts


def _sample(model, prompt) -> tuple[torch.Tensor, torch.Tensor, int]:
    cfg = DecodeConfig(
        max_new_tokens=4, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P,
        speculative="prompt_lookup", num_draft_tokens=3, max_ngram=2, adaptive=False,
    )

    def prefill(parts: list[PromptParts]) -> CompressedPrefill:  # many rows per prefill: fast
        return CompressedPrefill(prefill_full(model, [p.full_ids for p in parts], 0), [0] * len(parts), [0.0] * len(parts))

    eng = Engine(model, cfg, prefill=prefill, slots=256, group_rows=256, expected_tokens=32)
    parts = PromptParts([], list(prompt), [])
    out = eng.run(Request(i, parts, list(prompt), seed=i) for i in range(ROWS))
    return second_third_counts([o.result for o in out])


def test_speculative_sampling_matches_model_distribution(small_vocab_model, prompt, exact_marginals):
    m2, m3 = exact_marginals
    t2, t3, drafted = _sample(small_vocab_model, prompt)
    assert drafted > ROWS  # speculation really ran on most rows
    assert chi2_excess(t2, m2.double()) < 1.0
    assert chi2_excess(t3, m3.double()) < 1.0


def test_a_wrong_rule_is_detected(small_vocab_model, prompt, exact_marginals, monkeypatch):
    # Broken on purpose: after a rejection, sample from p WITHOUT removing the rejected draft.
    monkeypatch.setattr(verify, "_residual", lambda dist, rejected, was_rejected: dist)
    m2, m3 = exact_marginals
    t2, t3, _ = _sample(small_vocab_model, prompt)
    assert max(chi2_excess(t2, m2.double()), chi2_excess(t3, m3.double())) > 1.0
