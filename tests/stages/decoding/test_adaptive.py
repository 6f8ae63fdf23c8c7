"""Adaptive speculation: per-row draft lengths, acceptance model, step cost, width choice."""

from __future__ import annotations

from stages.decoding.adaptive import AcceptanceModel, DraftLengths, StepCost, Tuning, choose_width


def test_draft_length_grows_shrinks_pauses_and_probes():
    t = Tuning(k_init=4, grow=4, pause_below=0.1, pause_steps=3)
    dl = DraftLengths(rows=1, k_max=16, tuning=t)
    assert dl.allowed(0) == 4
    dl.update(0, drafted=4, accepted=4)  # full acceptance: grow
    assert dl.allowed(0) == 8
    dl.update(0, drafted=8, accepted=2)  # rejection: shrink to accepted + 1
    assert dl.allowed(0) == 3
    floored = DraftLengths(rows=1, k_max=16, tuning=Tuning(k_init=8, k_floor=4))
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


def test_width_follows_expected_gain_per_cost():
    am = AcceptanceModel()
    flat = StepCost(prior=(0.0, 0.0))
    flat.observe(1, 0.1)
    steep = StepCost(prior=(0.5, 2.0))
    steep.observe(1, 0.1)
    # Nothing drafted: plain step.
    assert choose_width([0, 0], [0, 0], am, flat, 1.05) == 1
    # Free verification: feed everything drafted.
    assert choose_width([6, 2], [4, 4], am, flat, 1.05) == 7
    # Expensive verification and weak (1-gram) matches: do not speculate.
    assert choose_width([6, 2], [1, 1], am, steep, 1.05) == 1
