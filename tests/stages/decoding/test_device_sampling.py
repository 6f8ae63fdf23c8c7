"""The static engine's on-device speculative sampling follows the model's distribution.

As test_engine_sampling.py does for the dynamic engine (fixtures in conftest.py): a tiny
Llama with a 16-token vocabulary, thousands of rows of one prompt with different
seeds decoded together with prompt lookup forced on, the 2nd and 3rd tokens' counts
against the exact marginals (chi-square); and the same test catches a wrong rule.
"""

from __future__ import annotations

import pytest
import torch
from sampling_stats import ROWS, TEMP, TOP_P, chi2_excess, second_third_counts

from stages.decoding import device_sampling
from stages.decoding.config import DecodeConfig
from stages.decoding.device_sampling import uniforms
from stages.decoding.slot_engine import SlotEngine
from stages.decoding.state import prefill_full


def _sample(model, prompt) -> tuple[torch.Tensor, torch.Tensor, int]:
    cfg = DecodeConfig(
        max_new_tokens=4, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P,
        speculative="prompt_lookup", num_draft_tokens=3, max_ngram=2, adaptive=False,
    )
    eng = SlotEngine(model, slots=ROWS, max_drafts=3, capacity=32)
    out, _ = eng.run([list(prompt)] * ROWS, list(range(ROWS)), lambda idx: prefill_full(model, [prompt] * len(idx), 0), cfg)
    return second_third_counts(out)


def test_on_device_speculative_sampling_matches_model_distribution(small_vocab_model, prompt, exact_marginals):
    m2, m3 = exact_marginals
    t2, t3, drafted = _sample(small_vocab_model, prompt)
    assert drafted > ROWS
    assert chi2_excess(t2, m2.double()) < 1.0
    assert chi2_excess(t3, m3.double()) < 1.0


def test_a_wrong_rule_is_detected(small_vocab_model, prompt, exact_marginals, monkeypatch):
    # Broken on purpose: after a rejection, sample from p WITHOUT removing the rejected draft.
    monkeypatch.setattr(device_sampling, "_residual", lambda dist, rejected, was_rejected: dist)
    m2, m3 = exact_marginals
    t2, t3, _ = _sample(small_vocab_model, prompt)
    assert max(chi2_excess(t2, m2.double()), chi2_excess(t3, m3.double())) > 1.0


def test_uniforms_are_uniform_and_keyed():
    seeds = torch.tensor([0, 1, 2**62 + 5])
    pos = torch.arange(50_000).repeat(3, 1)
    u = uniforms(seeds, pos, 0)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert torch.allclose(u.mean(dim=1), torch.full((3,), 0.5, dtype=torch.float64), atol=0.01)
    hist = torch.histc(u[0].float(), bins=10, min=0.0, max=1.0)
    assert (hist - 5000).abs().max() < 300  # ~4 sigma
    assert not torch.equal(u, uniforms(seeds, pos, 1))  # lanes differ
    assert torch.equal(uniforms(seeds[1:2], pos[1:2, 100:200], 0), u[1:2, 100:200])  # keyed, no state
    with pytest.raises(AssertionError):
        torch.testing.assert_close(u[0], u[1])  # seeds differ
