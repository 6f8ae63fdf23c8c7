"""pipeline/host_load.py: one rule for a machine too busy for its time figures."""

from __future__ import annotations

from pipeline.host_load import busy_note, load_now


def test_a_load_above_the_cpus_at_the_start_or_the_end_is_said():
    assert busy_note([3.3, 1.0], 2) == ("the load average (3.30, 1.00 at the start and end) was above this "
                                        "machine's 2 CPUs: other work shared them")
    assert busy_note([1.0, 2.5], 2) is not None
    assert busy_note([1.9, 2.0], 2) is None  # at most one per CPU: quiet enough
    assert busy_note([9.0], None) is None  # unknown CPU count: nothing said
    assert load_now() >= 0.0
