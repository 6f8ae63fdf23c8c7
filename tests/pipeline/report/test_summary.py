"""Run summaries: status, error counts by kind, versions, the JSON record."""

from __future__ import annotations

import json
import re
import statistics

import pyarrow as pa
import pytest

from pipeline.report.summary import (
    RunTally,
    format_summary,
    package_versions,
    run_record_json,
    run_summary,
    summarize,
)
from schemas.output import INPUT, RETRYABLE, rows_to_table


def _table(errors: list[tuple[str | None, str | None]]):
    return rows_to_table([
        {"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{i}", "request_id": f"q{i}",
         "error": err, "error_kind": kind, "output_tokens": None if err else 5, "e2e_s": 1.0}
        for i, (err, kind) in enumerate(errors)
    ])


def test_status_follows_the_date_and_the_abort():
    figures = _table([(None, None), ("read: empty", INPUT), ("generate: OSError", RETRYABLE)])
    date = {"rows": 10, "failed": 2, "errors_input": 1, "errors_retryable": 1}
    s = run_summary(RunTally().add(figures), wall_s=2.0, date_counts=date, aborted=None)
    assert s["status"] == "partial" and s["errors_by_kind"] == {"input": 1, "retryable": 1}
    assert s["date_failed_fraction"] == 0.2 and s["date_errors_by_kind"] == {"input": 1, "retryable": 1}
    clean = {"rows": 10, "failed": 0, "errors_input": 0, "errors_retryable": 0}
    assert run_summary(RunTally().add(figures), 2.0, clean, None)["status"] == "succeeded"
    failed = run_summary(RunTally().add(figures), 2.0, clean, aborted=RuntimeError("actor died"))
    assert failed["status"] == "failed" and failed["abort_reason"] == "RuntimeError: actor died"
    assert "status" in format_summary(s) and "partial" in format_summary(s)


def test_record_carries_versions_and_round_trips():
    versions = package_versions()
    assert versions["longdoc"] and versions["pyarrow"] and versions["ray"] and versions["python"]
    s = run_summary(RunTally().add(_table([(None, None)])), 1.0, {"rows": 1, "failed": 0}, None)
    s["versions"] = versions
    record = json.loads(run_record_json(s, {"name": "j"}))
    assert record["summary"]["versions"] == versions and record["spec"] == {"name": "j"}


def test_prompt_tokens_from_the_prefix_cache_are_summed_over_successful_rows():
    rows = [{"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d0", "request_id": f"q{i}",
             "error": err, "prompt_tokens": 100, "cached_prompt_tokens": cached, "e2e_s": 1.0}
            for i, (err, cached) in enumerate([(None, 0), (None, 80), (None, 80), ("generate: OSError", None)])]
    s = summarize(rows_to_table(rows), wall_s=1.0)
    assert s["tokens_in"] == 300 and s["tokens_in_cached"] == 160
    assert re.search(r"of them from the prefix cache +160\n", format_summary(s))
    # an output written before schema version 5 has no such column: nothing was cached
    old = rows_to_table(rows[:1]).drop_columns(["cached_prompt_tokens"])
    assert summarize(old)["tokens_in_cached"] == 0


def _rows(n: int, seed: int) -> list[dict]:
    """Rows of 7 documents (a document's rows spread over blocks), some failed, some
    figures null."""
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(n):
        failed = rnd.random() < 0.2
        out.append({"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{rnd.randrange(7)}",
                    "request_id": f"q{seed}-{i}", "error": "generate: OSError" if failed else None,
                    "error_kind": rnd.choice(["input", "retryable", None]) if failed else None,
                    "output_tokens": None if failed else rnd.randrange(1, 50),
                    "prompt_tokens": rnd.randrange(10, 900), "cached_prompt_tokens": rnd.randrange(0, 10),
                    "draft_tokens": rnd.randrange(0, 9), "accepted_tokens": rnd.randrange(0, 5),
                    "doc_tokens": rnd.randrange(100, 4000),
                    "context_tokens": None if rnd.random() < 0.3 else rnd.randrange(1, 600),
                    "e2e_s": None if rnd.random() < 0.1 else rnd.uniform(0.1, 9.0),
                    "device_s": rnd.uniform(0, 2), "cost_usd": rnd.uniform(0, 0.01),
                    "compression": rnd.choice(["finch", "rag", None]), "compress_s": rnd.uniform(0, 0.5),
                    "prefill_s": rnd.uniform(0.5, 1.0), "stall_s": rnd.uniform(0, 3)})
    return out


@pytest.mark.parametrize("wall_s", [None, 12.5])
def test_the_tally_folded_block_by_block_equals_the_summary_of_all_rows(wall_s):
    blocks = [rows_to_table(_rows(n, seed)) for seed, n in enumerate([9, 1, 0, 30, 17])]
    tally = RunTally()
    for b in blocks:
        tally.add(b)
    whole = summarize(pa.concat_tables(blocks), wall_s=wall_s)
    folded = tally.summary(wall_s)
    assert folded.keys() == whole.keys()
    for k, v in whole.items():
        assert folded[k] == pytest.approx(v), k
    assert folded["documents"] == 7 and folded["rows"] == 57
    rows = [r for seed, n in enumerate([9, 1, 0, 30, 17]) for r in _rows(n, seed)]  # by hand
    ok = [r for r in rows if r["error"] is None]
    assert folded["tokens_out"] == sum(r["output_tokens"] for r in ok)
    assert folded["p50_e2e_s"] == pytest.approx(statistics.median(r["e2e_s"] for r in ok if r["e2e_s"] is not None))
    e2e = sorted(r["e2e_s"] for r in ok if r["e2e_s"] is not None)
    at = 0.95 * (len(e2e) - 1)  # the 95th percentile, interpolated between the two nearest rows
    assert folded["p95_e2e_s"] == pytest.approx(e2e[int(at)] + (at - int(at)) * (e2e[int(at) + 1] - e2e[int(at)]))
    basis = wall_s or sum(r["device_s"] for r in rows)  # the wall time when known, else device seconds
    assert folded["throughput_basis"] == ("wall" if wall_s else "device")
    assert folded["docs_per_s"] == pytest.approx(7 / basis)
    assert folded["output_tokens_per_s"] == pytest.approx(folded["tokens_out"] / basis)
    sized = [r for r in ok if r["context_tokens"] is not None]
    assert folded["compression_ratio"] == pytest.approx(
        sum(r["doc_tokens"] for r in sized) / sum(r["context_tokens"] for r in sized))
    assert tally.errors == run_summary(RunTally().add(pa.concat_tables(blocks)), wall_s, {"rows": 1, "failed": 0},
                                       None)["errors_by_kind"]
    assert sum(tally.errors.values()) == folded["failed"] > 0


def test_the_tally_keeps_a_float_and_an_int_a_row_not_the_rows():
    tally = RunTally()
    for seed in range(200):  # 200 blocks of 50 rows: the document hashes fold as they come
        tally.add(rows_to_table(_rows(50, seed)))
    assert len(tally._docs) < 64 and sum(len(d) for d in tally._docs) <= 7 * 64
    assert sum(a.nbytes for a in tally._e2e) <= 8 * 10_000
    assert tally.summary()["documents"] == 7 and tally.rows == 10_000


def test_an_empty_run_has_the_summary_of_no_rows():
    empty = rows_to_table([])
    assert RunTally().add(empty).summary(1.0) == summarize(empty, wall_s=1.0)


def test_device_time_splits_into_the_methods_reading_the_prompts_prefill_and_decode():
    """Where a run's time went (pipeline/report/summary.py): a method reading inside the
    engine's prefill (finch) is counted apart from the prompts' prefill; a text method's
    compression (rag) happens before the engine and is not device time."""
    base = {"run_id": "r", "run_date": "2026-01-01", "job": "j", "e2e_s": 1.0}
    rows = [
        {**base, "doc_id": "a", "request_id": "q0", "compression": "finch", "compress_s": 3.0, "prefill_s": 3.5,
         "device_s": 4.0, "stall_s": 1.0},
        {**base, "doc_id": "a", "request_id": "q1", "compression": "finch", "compress_s": 3.0, "prefill_s": 3.5,
         "device_s": 4.5, "stall_s": 0.0, "error": "generate: OSError", "error_kind": "retryable"},
        {**base, "doc_id": "b", "request_id": "q2", "compression": "rag", "compress_s": 2.0, "prefill_s": 1.0,
         "device_s": 1.5, "stall_s": 2.0},
    ]
    s = summarize(rows_to_table(rows))
    assert s["time_method_read_s"] == 6.0 and s["time_text_compress_s"] == 2.0
    assert s["time_prompt_prefill_s"] == pytest.approx(8.0 - 6.0)  # prefill_s 8.0 in all
    assert s["time_decode_s"] == pytest.approx(10.0 - 8.0) and s["time_stall_s"] == 3.0
    assert s["time_method_read_s"] + s["time_prompt_prefill_s"] + s["time_decode_s"] == pytest.approx(s["device_s"])
    text = format_summary(s)
    lines = {line.rsplit("  ", 1)[0].strip(): line.rsplit("  ", 1)[1] for line in text.splitlines()[1:]}
    assert lines["the method reading documents"] == "6" and lines["text compression before the engine (s, in the cost)"] == "2"
    assert lines["a row's wait on others' prefill (mean s)"] == "1"  # 3.0 s over 3 rows
    old = rows_to_table(rows).drop_columns(["compress_s", "prefill_s", "stall_s"])  # an output of an early version
    assert summarize(old)["time_method_read_s"] == 0.0


def test_the_compression_ratio_is_the_runs_tokens_read_of_its_tokens_given_not_a_mean_of_rows():
    """A row keeping 9 tokens of 2,754 (ratio 306) must not swamp the run's figure: the
    summary's ratio is sum(doc_tokens) / sum(context_tokens) over the ok rows."""
    base = {"run_id": "r", "run_date": "2026-01-01", "job": "j", "e2e_s": 1.0}
    sizes = [(2754, 9, None), (3000, 1000, None), (3000, 1500, None), (9000, 10, "generate: OSError")]
    rows = [{**base, "doc_id": f"d{i}", "request_id": f"q{i}", "doc_tokens": doc, "context_tokens": ctx,
             "compression_ratio": doc / ctx, "error": err, "error_kind": RETRYABLE if err else None}
            for i, (doc, ctx, err) in enumerate(sizes)]
    s = summarize(rows_to_table(rows))
    assert s["compression_ratio"] == pytest.approx((2754 + 3000 + 3000) / (9 + 1000 + 1500))  # 3.489
    assert statistics.mean(r["compression_ratio"] for r in rows[:3]) > 100  # what a mean of rows said
    assert re.search(r"compression ratio \(document tokens / tokens kept\) +3\.489\n", format_summary(s))
    assert summarize(rows_to_table(rows[3:]))["compression_ratio"] is None  # no ok row: no figure


def test_answers_cut_at_max_new_tokens_are_counted_where_the_rows_say_why_they_stopped():
    reasons = ["length", "eos", "length", "stop", "repeat", None]
    t = rows_to_table([
        {"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": f"d{i}", "request_id": f"q{i}",
         "error": None if why else "generate: OSError", "error_kind": None if why else RETRYABLE,
         "output_tokens": 5, "e2e_s": 1.0, "finish_reason": why}
        for i, why in enumerate(reasons)
    ])
    s = summarize(t)
    assert s["ok"] == 5 and s["cut_off"] == 2 and s["cut_repeat"] == 1
    assert re.search(r"of them cut at max_new_tokens +2\n", format_summary(s))
    assert re.search(r"of them cut by the repeat guard +1\n", format_summary(s))
    # Rows written before the column existed (a file without it, or one `longdoc report` reads
    # conformed, the column null): nothing is known, nothing is said.
    for old in (summarize(t.drop_columns(["finish_reason"])), summarize(t.set_column(
            t.schema.get_field_index("finish_reason"), "finish_reason", pa.nulls(t.num_rows, pa.string())))):
        assert old["cut_off"] is None and "max_new_tokens" not in format_summary(old)
        assert "repeat guard" not in format_summary(old)


def test_tokens_per_decode_step_say_what_speculation_saved_in_forward_passes():
    # Row 0: 10 tokens in 4 steps after prefill (5 passes); row 1: 6 tokens in 5 (6 passes);
    # row 2 failed; row 3 has no decode_steps (written before the column): left out.
    rows = [{"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d0", "request_id": f"q{i}",
             "error": err, "output_tokens": out, "decode_steps": steps, "draft_tokens": drafted,
             "accepted_tokens": acc, "e2e_s": 1.0}
            for i, (err, out, steps, drafted, acc) in enumerate(
                [(None, 10, 4, 8, 5), (None, 6, 5, 0, 0), ("generate: OSError", None, None, None, None),
                 (None, 7, None, None, None)])]
    s = summarize(rows_to_table(rows), wall_s=1.0)
    assert s["tokens_per_step"] == pytest.approx(16 / 11) and s["draft_tokens"] == 8
    assert s["acceptance_rate"] == pytest.approx(5 / 8)
    text = format_summary(s)
    assert re.search(r"  of tokens drafted +8\n", text) and re.search(r"tokens per decode step .* +1\.455\n", text)
    assert summarize(rows_to_table(rows[3:]))["tokens_per_step"] is None


def test_rows_the_repeat_guard_cut_are_left_out_of_tokens_per_decode_step():
    """A row cut by the repeat guard keeps fewer tokens than its steps made (the loop is
    dropped): a new user's six summaries, all cut so, read 0.79 tokens per step."""
    rows = [{"run_id": "r", "run_date": "2026-01-01", "job": "j", "doc_id": "d0", "request_id": f"q{i}",
             "error": None, "output_tokens": out, "decode_steps": steps, "finish_reason": why, "e2e_s": 1.0}
            for i, (out, steps, why) in enumerate([(10, 4, "eos"), (7, 27, "repeat"), (6, 5, None)])]
    s = summarize(rows_to_table(rows), wall_s=1.0)
    assert s["tokens_per_step"] == pytest.approx(16 / 11)  # rows 0 and 2, as the test above
    assert s["tokens_out"] == 23  # the cut row's kept tokens still count as output
    assert summarize(rows_to_table(rows[1:2]))["tokens_per_step"] is None
