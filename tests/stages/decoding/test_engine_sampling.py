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
from sampling_stats import ROWS, TEMP, TOP_K, TOP_P, chi2_excess, second_third_counts

from stages.decoding import engine as engine_module
from stages.decoding import verify
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.request import Request
from stages.decoding.state import CompressedPrefill, prefill_full
from stages.prompting import PromptParts


def _sample(model, prompt) -> tuple[torch.Tensor, torch.Tensor, int]:
    cfg = DecodeConfig(
        max_new_tokens=4, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P, top_k=TOP_K,
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
    # Broken on purpose: Leviathan's acceptance test, but a rejected position resamples
    # from p WITHOUT removing the rejected draft (the draft is then over-represented).
    def wrong(probs, feed, n_fed, seeds, start):
        t = probs.shape[1]
        positions = start[:, None] + torch.arange(t)
        p_draft = probs[:, :-1].gather(2, feed[:, 1:, None]).squeeze(2).double()
        ok = (verify.uniforms(seeds, positions[:, :-1], 0) < p_draft) & (torch.arange(1, t)[None] < n_fed[:, None])
        accepted = ok.long().cumprod(dim=1).sum(dim=1)
        return accepted, verify.sampled(probs, seeds, positions).gather(1, accepted[:, None]).squeeze(1)

    monkeypatch.setattr(engine_module, "sample_accept", wrong)
    m2, m3 = exact_marginals
    t2, t3, _ = _sample(small_vocab_model, prompt)
    assert max(chi2_excess(t2, m2.double()), chi2_excess(t3, m3.double())) > 1.0


def test_a_seed_gives_the_same_text_whatever_the_drafting(small_vocab_model, prompt):
    """The token at each position is its keyed draw (stages/decoding/verify.py): speculation
    on or off, and the draft widths, change how many steps a row takes, not its text."""
    texts, drafted = {}, {}
    for name, spec, drafts in (("plain", "none", 1), ("lookup-3", "prompt_lookup", 3), ("lookup-1", "prompt_lookup", 1)):
        cfg = DecodeConfig(max_new_tokens=8, eos_ids=frozenset({-1}), temperature=TEMP, top_p=TOP_P, top_k=TOP_K,
                           speculative=spec, num_draft_tokens=drafts, max_ngram=2, adaptive=False)

        def prefill(parts: list[PromptParts]) -> CompressedPrefill:
            return CompressedPrefill(prefill_full(small_vocab_model, [p.full_ids for p in parts], 0),
                                     [0] * len(parts), [0.0] * len(parts))

        eng = Engine(small_vocab_model, cfg, prefill=prefill, slots=64, group_rows=64, expected_tokens=32)
        out = eng.run(Request(i, PromptParts([], list(prompt), []), list(prompt), seed=i) for i in range(64))
        texts[name] = {o.key: list(o.result.tokens) for o in out}
        drafted[name] = sum(o.result.draft_tokens for o in out)
    assert drafted["plain"] == 0 and drafted["lookup-3"] > 64  # drafts were judged on most rows
    assert texts["lookup-3"] == texts["plain"] and texts["lookup-1"] == texts["plain"]
    assert len({tuple(t) for t in texts["plain"].values()}) > 8  # the seeds differ: not one greedy text
