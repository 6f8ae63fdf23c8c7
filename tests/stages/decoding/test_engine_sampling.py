"""Speculative sampling follows the model's distribution exactly (statistical test).

A tiny Llama with a 16-token vocabulary makes the exact distribution of the first
generated tokens computable by enumeration. Thousands of rows with the same prompt
and different seeds are decoded in one batch with prompt lookup forced on; the
frequencies of the 2nd and 3rd tokens (drafted, accepted or corrected) are compared
with the exact marginals by a chi-square test. The same test must reject a wrong
acceptance rule, which shows it has the power to catch one.
"""

from __future__ import annotations

import torch
from sampling_stats import ROWS, TEMP, TOP_P, chi2_excess, second_third_counts

from stages.decoding import engine
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.state import prefill_full


def _sample(model, prompt) -> tuple[torch.Tensor, torch.Tensor, int]:
    cfg = DecodeConfig(
        max_new_tokens=4, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P,
        speculative="prompt_lookup", num_draft_tokens=3, max_ngram=2, adaptive=False,
    )
    state = prefill_full(model, [prompt] * ROWS, 0)
    out = decode(EngineState(model), state, [list(prompt)] * ROWS, cfg, seeds=list(range(ROWS)))
    return second_third_counts(out)


def test_speculative_sampling_matches_model_distribution(small_vocab_model, prompt, exact_marginals):
    m2, m3 = exact_marginals
    t2, t3, drafted = _sample(small_vocab_model, prompt)
    assert drafted > ROWS  # speculation really ran on most rows
    assert chi2_excess(t2, m2.double()) < 1.0
    assert chi2_excess(t3, m3.double()) < 1.0


def _wrong_rule(drafts, probs, p_drafts, generator):
    """Broken on purpose: on rejection, resample from p WITHOUT removing the draft."""
    n = len(drafts)
    u = torch.rand(max(n, 1), generator=generator).tolist()
    for i in range(n):
        if u[i] >= p_drafts[i]:
            tok = int(torch.multinomial(probs[i], 1, generator=generator))
            return i, drafts[:i] + [tok]
    return n, drafts + [int(torch.multinomial(probs[n], 1, generator=generator))]


def test_a_wrong_rule_is_detected(small_vocab_model, prompt, exact_marginals, monkeypatch):
    monkeypatch.setattr(engine, "accept_sampled", _wrong_rule)
    m2, m3 = exact_marginals
    t2, t3, _ = _sample(small_vocab_model, prompt)
    assert max(chi2_excess(t2, m2.double()), chi2_excess(t3, m3.double())) > 1.0
