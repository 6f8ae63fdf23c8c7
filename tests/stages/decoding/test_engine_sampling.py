"""Speculative sampling follows the model's distribution exactly (statistical test).

A tiny Llama with a 16-token vocabulary makes the exact distribution of the first
generated tokens computable by enumeration. Thousands of rows with the same prompt
and different seeds are decoded in one batch with prompt lookup forced on; the
frequencies of the 2nd and 3rd tokens (drafted, accepted or corrected) are compared
with the exact marginals by a chi-square test. The same test must reject a wrong
acceptance rule, which shows it has the power to catch one.
"""

from __future__ import annotations

import math

import pytest
import torch

from stages.decoding import engine
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.sampling import target_probs
from stages.decoding.state import prefill_full

V, ROWS, TEMP, TOP_P = 16, 3000, 1.0, 0.95


@pytest.fixture(scope="module")
def small_vocab_model(tiny_llama_factory):
    # A larger init spreads the logits: peaked distributions, so drafts are often
    # accepted and often rejected.
    return tiny_llama_factory(V, seed=3, initializer_range=0.2)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return torch.randint(0, V, (20,), generator=torch.Generator().manual_seed(0)).tolist()


def _probs(model, seqs: list[list[int]]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor(seqs)).logits[:, -1]
    return target_probs(logits, TEMP, TOP_P)  # [N, V]


@pytest.fixture(scope="module")
def exact_marginals(small_vocab_model, prompt) -> tuple[torch.Tensor, torch.Tensor]:
    p1 = _probs(small_vocab_model, [prompt])[0]  # [V]
    p2 = _probs(small_vocab_model, [prompt + [a] for a in range(V)])  # [V, V]
    p3 = _probs(small_vocab_model, [prompt + [a, b] for a in range(V) for b in range(V)])  # [V*V, V]
    joint12 = p1[:, None] * p2  # [V, V]
    return joint12.sum(0), joint12.flatten() @ p3


def _chi2_excess(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square statistic over its p = 1e-4 critical value (> 1: reject)."""
    expected = probs * counts.sum()
    big = expected >= 5  # pool rare cells into one
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.719  # one-sided normal quantile for 1e-4; Wilson-Hilferty approximation
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat / crit


def _sample(model, prompt) -> tuple[torch.Tensor, torch.Tensor, int]:
    cfg = DecodeConfig(
        max_new_tokens=4, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P,
        speculative="prompt_lookup", num_draft_tokens=3, max_ngram=2, adaptive=False,
    )
    state = prefill_full(model, [prompt] * ROWS, 0)
    out = decode(EngineState(model), state, [list(prompt)] * ROWS, cfg, seeds=list(range(ROWS)))
    t2 = torch.bincount(torch.tensor([r.tokens[1] for r in out]), minlength=V).double()
    t3 = torch.bincount(torch.tensor([r.tokens[2] for r in out]), minlength=V).double()
    drafted = sum(r.draft_tokens for r in out)
    rejected = drafted - sum(r.accepted_tokens for r in out)
    assert sum(r.accepted_tokens for r in out) > ROWS // 10 and rejected > ROWS // 10
    return t2, t3, drafted


def test_speculative_sampling_matches_model_distribution(small_vocab_model, prompt, exact_marginals):
    m2, m3 = exact_marginals
    t2, t3, drafted = _sample(small_vocab_model, prompt)
    assert drafted > ROWS  # speculation really ran on most rows
    assert _chi2_excess(t2, m2.double()) < 1.0
    assert _chi2_excess(t3, m3.double()) < 1.0


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
    assert max(_chi2_excess(t2, m2.double()), _chi2_excess(t3, m3.double())) > 1.0
