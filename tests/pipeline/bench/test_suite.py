"""The decode suite's pieces that need no model: settings checks, adding batches up, the CPU checks."""

from __future__ import annotations

import pytest

from pipeline.bench.suite import CPU_CHECKS, Settings, _merge_runs, check_settings, cpu_checks
from pipeline.bench.systems import Run


def test_settings_are_checked_with_the_option_named():
    check_settings(Settings())
    for bad, match in (
        (Settings(device="tpu"), "--device 'tpu'"), (Settings(systems=("longdoc", "vllm")), "--systems"),
        (Settings(batch_sizes=(0,)), "--batch-sizes"), (Settings(batch_sizes=(300,)), "1..256"),
        (Settings(new_tokens=1), "--new-tokens 1"), (Settings(verify_widths=(1,)), "--verify-widths"),
        (Settings(tasks=("translate",)), "--tasks"), (Settings(min_rows=0), "--min-rows"),
        (Settings(hf_pld_tokens=0), "--hf-pld-tokens"), (Settings(compile="cudagraphs"), "CUDA"),
        (Settings(usd_per_device_hour=-1), "--usd-per-device-hour"),
    ):
        with pytest.raises(ValueError, match=match):
            check_settings(bad)


def test_batches_of_one_size_add_up():
    a = Run([[1, 2], [3]], 2.0, prefill_s=0.5, steps=2, row_steps=3, drafted=4, accepted=1)
    b = Run([[4]], 1.0, prefill_s=0.25, steps=1, row_steps=1)
    m = _merge_runs([a, b])
    assert (m.tokens, m.seconds, m.prefill_s, m.steps, m.drafted, m.accepted) == ([[1, 2], [3], [4]], 3.0, 0.75, 3, 4, 1)
    assert _merge_runs([a, Run([[5]], 1.0)]).prefill_s is None  # a system without a measured prefill


def _rec(task: str, b: int, tok: dict[str, float], identical: float = 1.0) -> dict:
    return {"task": task, "batch_size": b,
            "systems": {x: {"status": "ok", "decode_tok_s": v} for x, v in tok.items()},
            "agreement_with_longdoc": {"longdoc-pld": {"rows_identical": identical}}}


def test_cpu_checks_pass_fail_and_not_measured():
    results = [
        _rec("summarize", 1, {"longdoc": 10, "hf-dynamic": 9, "longdoc-pld": 12, "hf-pld": 10}),
        _rec("qa", 1, {"longdoc": 10, "hf-dynamic": 11, "longdoc-pld": 14, "hf-pld": 13}),
        _rec("qa", 8, {"longdoc": 30, "hf-dynamic": 20, "longdoc-pld": 27}, identical=0.5),
    ]
    got = dict(cpu_checks(results))
    assert list(got) == list(CPU_CHECKS)
    assert got[CPU_CHECKS[0]] is False  # qa B=1: 10 < 11
    assert got[CPU_CHECKS[1]] is False  # qa: 14 < 1.1 x 13
    assert got[CPU_CHECKS[2]] is True  # qa B=1: 14 >= 1.3 x 10
    assert got[CPU_CHECKS[3]] is False  # qa B=8: 27 < 0.95 x 30
    assert got[CPU_CHECKS[4]] is False  # half the rows differ
    assert dict(cpu_checks([_rec("summarize", 4, {"longdoc": 1})]))[CPU_CHECKS[1]] is None  # not measured
