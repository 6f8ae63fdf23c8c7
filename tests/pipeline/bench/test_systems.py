"""Agreement figures and the clock the bench times with."""

from __future__ import annotations

import torch

from pipeline.bench.systems import Clock, agreement, first_divergence


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_agreement_counts_rows_and_earliest_divergence():
    ag = agreement([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 0, 6], [7, 8, 9]])
    assert ag["rows"] == 3
    assert ag["rows_identical"] == 1 / 3
    assert ag["first_divergence"] == 1
    assert ag["first_divergence_by_row"] == [None, 1, 2]


def test_cpu_clock_is_process_time_at_one_thread():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert Clock(torch.device("cpu")).name.startswith("process_time")
        torch.set_num_threads(2)
        assert Clock(torch.device("cpu")).name == "perf_counter"
    finally:
        torch.set_num_threads(before)
