"""Adaptive speculation: per-row draft lengths, acceptance model, step cost, width choice."""

from __future__ import annotations

from stages.decoding.adaptive import (
    AcceptanceModel,
    DraftLengths,
    StepCost,
    Tuning,
    choose_width,
    explore_width,
)


def test_draft_length_grows_shrinks_pauses_and_probes():
    t = Tuning(k_init=4, grow=4, pause_below=0.1, pause_steps=3)
    dl = DraftLengths(k_max=16, tuning=t)
    assert dl.allowed(0) == 4
    dl.update(0, drafted=4, accepted=4)  # full acceptance: grow
    assert dl.allowed(0) == 8
    dl.update(0, drafted=8, accepted=2)  # rejection: shrink to accepted + 1
    assert dl.allowed(0) == 3
    floored = DraftLengths(k_max=16, tuning=Tuning(k_init=8, k_floor=4))
    floored.update(0, drafted=6, accepted=0)  # shrinks, but not below k_floor
    assert floored.allowed(0) == 4
    for _ in range(5):  # poor acceptance (8+ drafted tokens of evidence): pause
        assert dl.allowed(0) > 0
        dl.update(0, drafted=3, accepted=0)
    assert [dl.allowed(0) for _ in range(3)] == [0, 0, 0]
    assert dl.allowed(0) == 1  # probing again
    dl.update(0, drafted=1, accepted=0)
    dl.update(0, drafted=8, accepted=0)
    # A second pause in a row lasts twice as long.
    assert [dl.allowed(0) for _ in range(7)] == [0] * 6 + [1]


def test_acceptance_model_learns_by_match_length():
    am = AcceptanceModel(prior_weight=1.0, decay=1.0)
    for _ in range(50):
        am.update(1, drafted=4, accepted=0)
        am.update(3, drafted=4, accepted=4)
    assert am.rates(1)[0] < 0.05 and am.rates(3)[0] > 0.95
    assert am.expected(3, 4) > 3.5 > 0.2 > am.expected(1, 4)
    assert am.expected(3, 0) == 0.0 and am.expected(0, 4) == 0.0


def test_step_cost_fits_observed_steps():
    cost = StepCost(prior=(0.0, 0.0))  # a wrong prior: flat cost
    for _ in range(60):
        for m in (1, 2, 8, 16):
            cost.observe(m, 0.1 + 0.01 * m + (0.05 if m > 1 else 0.0))
    a, c, j = cost.coefficients()
    assert abs(a - 0.1) < 0.02 and abs(c - 0.01) < 0.003 and abs(j - 0.05) < 0.02


def test_width_follows_expected_time_saved():
    am = AcceptanceModel()
    flat = StepCost(prior=(0.0, 0.0))
    flat.observe(1, 0.1)
    steep = StepCost(prior=(0.5, 2.0))
    steep.observe(1, 0.1)
    # Nothing drafted: plain step.
    assert choose_width([0, 0], [0, 0], am, flat, 1.05) == 1
    # Free verification, one row critical (most tokens left): feed all its drafts.
    assert choose_width([6, 2], [4, 4], am, flat, 1.05, remaining=[40, 10]) == 7
    # Free verification, both rows critical: drafts past the shorter one cannot
    # shorten the batch, so the step stops at the shorter draft.
    assert choose_width([6, 2], [4, 4], am, flat, 1.05, remaining=[40, 40]) == 3
    # Expensive verification and weak (1-gram) matches: do not speculate.
    assert choose_width([6, 2], [1, 1], am, steep, 1.05) == 1


def test_width_at_batch_one_weighs_accepted_tokens_against_step_cost():
    am = AcceptanceModel()
    cost = StepCost(prior=(0.0, 1.0))  # any wider step costs 2x a one-token step
    cost.observe(1, 0.1)
    # 4-gram matches: p_first 0.7, alpha 0.7 -> a 6-token draft yields ~2.1 tokens > 1.05 step.
    assert choose_width([6], [4], am, cost, 1.05) == 7
    # 1-gram matches: p_first 0.2 -> ~0.6 tokens, less than the extra step: no drafts.
    assert choose_width([6], [1], am, cost, 1.05) == 1


def test_expected_min_over_rows():
    am = AcceptanceModel(prior_weight=1.0, decay=1.0)
    p, a = am.rates(3)
    assert abs(am.expected_min([3], [2]) - am.expected(3, 2)) < 1e-9  # one row: its mean
    two = am.expected_min([3, 3], [2, 5])
    assert abs(two - (p * p + (p * a) ** 2)) < 1e-9  # capped by the shorter draft
    assert am.expected_min([3, 0], [2, 2]) == 0.0 and am.expected_min([], []) == 0.0


def test_step_cost_with_a_measured_kernel_shape():
    shape = {1: 0.0, 2: 0.1, 4: 0.1, 8: 1.0}.get  # flat to 4 tokens, then a jump
    cost = StepCost(prior=(0.0, 0.5), shape=lambda m: shape(m, 1.0))
    for _ in range(60):
        for m in (1, 2, 4, 8):
            cost.observe(m, 0.1 + 0.002 * m + 0.06 * shape(m, 1.0))
    assert abs(cost.predict(4) - (0.1 + 0.008 + 0.006)) < 0.005
    assert abs(cost.predict(8) - (0.1 + 0.016 + 0.06)) < 0.005


def test_width_on_buckets_and_padded_batches():
    """The static engine: widths from its buckets, and a step computes its whole batch bucket."""
    am = AcceptanceModel()
    gpu = StepCost(prior=(0.002, 0.0))  # the CUDA prior: cost grows slowly with tokens fed
    gpu.observe(1, 0.02)
    # One row, 5 drafts, buckets (1, 2, 4, 8, 17): the bucket holding all of them is 8.
    assert choose_width([5], [4], am, gpu, 1.05, candidates=(1, 2, 4, 8, 17)) == 8
    assert choose_width([5], [4], am, gpu, 1.05, candidates=(1, 2, 4)) == 4
    # 32 rows computed (a full bucket) but one row drafting with weak matches: at 17
    # wide the step would cost ~2x for ~1 token saved, so the step stays plain.
    rows = [16] + [0] * 31
    assert choose_width(rows, [1] + [0] * 31, am, gpu, 1.05, candidates=(1, 2, 4, 8, 17), fed_rows=32) == 1
    # The same single row alone in a bucket of 1: cheap to widen, worth it.
    assert choose_width([16], [4], am, gpu, 1.05, candidates=(1, 2, 4, 8, 17), fed_rows=1) == 17


def test_width_while_requests_wait_maximises_tokens_per_second():
    """Continuous batching: a row that finishes early frees its slot for a waiting request,
    so the slowest row does not decide; a wider step pays iff (rows + accepted) / cost grows."""
    am = AcceptanceModel()
    cost = StepCost(prior=(0.1, 0.0))  # a large fixed part: 0.1 s + 0.01 s per token fed
    cost.observe(1, 0.11)
    # Row 0 drafts on a 5-gram match (~2.3 tokens expected from 6); row 1 has most
    # tokens left and nothing to draft. Draining, the batch ends with row 1, so row 0's
    # tokens are worth only its marginal 0.01 s each: a plain step.
    assert choose_width([6, 0], [5, 0], am, cost, 1.05, remaining=[10, 40]) == 1
    # Requests waiting: row 0's accepted tokens are worth a step's cost per row (0.06 s):
    # widening raises tokens per second.
    assert choose_width([6, 0], [5, 0], am, cost, 1.05, remaining=[10, 40], refilling=True) > 1


def test_draft_lengths_forget_rows_and_take_any_key():
    dl = DraftLengths(k_max=8, tuning=Tuning(k_init=4))
    assert dl.allowed(("call", 7)) == 4
    dl.update(("call", 7), drafted=4, accepted=4)
    assert dl.allowed(("call", 7)) == 8
    dl.forget(("call", 7))
    assert dl.allowed(("call", 7)) == 4  # a new row with the same key starts afresh


def test_acceptance_is_learned_per_source_level():
    am = AcceptanceModel(prior_weight=1.0, decay=1.0)
    for _ in range(40):
        am.update(("prompt", 3), drafted=4, accepted=4)
        am.update(("outputs", 3), drafted=4, accepted=0)
    assert am.rates(("prompt", 3))[0] > 0.9 > 0.1 > am.rates(("outputs", 3))[0]
    assert am.expected(("outputs", 0), 4) == 0.0  # no match, no draft value


def test_an_exploring_width_is_the_next_one_past_the_choice_within_the_longest_draft():
    assert [explore_width(c, longest=7) for c in (1, 3, 7, 8)] == [2, 4, 8, 8]
    assert explore_width(1, longest=0) == 1  # no draft to feed: nothing to explore
    buckets = (1, 2, 4, 8, 16)
    assert [explore_width(c, longest=7, candidates=buckets) for c in (1, 2, 4, 8)] == [2, 4, 8, 8]
    assert explore_width(4, longest=3, candidates=buckets) == 4  # 4 already holds the longest draft
    assert explore_width(8, longest=12, candidates=buckets) == 16
