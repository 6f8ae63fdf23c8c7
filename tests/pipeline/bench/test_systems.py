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


def test_transformers_runs_count_their_steps_so_batches_add_up(tiny_model, tokenizer):
    """At B=1 the decode bench runs --min-rows batches and adds them up; transformers' runs
    counted no steps, the record fell back to new_tokens - 1 (one batch's) and its ms/step came
    out 4x too high at --min-rows 4."""
    from pipeline.bench.suite import _merge_runs, _system_record
    from pipeline.bench.systems import run_hf

    clock = Clock(torch.device("cpu"))
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    runs = [run_hf(tiny_model, [p], 6, tokenizer.pad_token_id, tokenizer.eos_token_id, clock, ignore_eos=True)
            for p in prompts]
    assert [r.steps for r in runs] == [5, 5]  # 6 tokens: the first from the prefill, 5 decode passes
    merged = _merge_runs(runs)
    rec = _system_record(merged, prefill_s=0.0, drafts=False)
    assert rec["steps"] == 10
    assert rec["ms_per_step"] == 1e3 * merged.seconds / 10
