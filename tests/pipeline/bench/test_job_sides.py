"""The sides of `longdoc bench job` (pipeline/bench/job_sides.py): engines per side and row totals."""

from __future__ import annotations


def test_a_sides_engines_are_its_largest_pool_under_ray_and_one_in_process():
    from types import SimpleNamespace

    from pipeline.bench.job_settings import parse_variant
    from pipeline.bench.job_sides import engines

    ray, local = SimpleNamespace(runner="ray", variants=()), SimpleNamespace(runner="local", variants=())
    assert engines(ray, "a", {"resources": {"actors": 2}}) == 2
    assert engines(ray, "a", {"resources": {"actors": [1, 3]}}) == 3  # an autoscaling pool may reach its max
    assert engines(local, "a", {"resources": {"actors": [1, 3]}}) == 1
    # A variant's own runner= wins over --runner, for that side only.
    mixed = SimpleNamespace(runner="ray", variants=(parse_variant("one:runner=local;resources.actors=2"),))
    assert engines(mixed, "one", {"resources": {"actors": 2}}) == 1 and engines(mixed, "b", {"resources": {"actors": 2}}) == 2
    assert mixed.variants[0].spec_overrides == ("resources.actors=2",) and mixed.variants[0].runner == "local"
    # auto: what `longdoc run` picks on one machine (one actor: in one process; a pool: Ray).
    auto = SimpleNamespace(runner="auto", variants=())
    assert engines(auto, "a", {"resources": {"actors": 1}}) == 1 and engines(auto, "a", {"resources": {"actors": 3}}) == 3


def test_a_sides_row_totals_count_successful_rows_and_the_prefix_caches_tokens():
    from pipeline.bench.job_sides import row_totals

    base = {"prefill_s": 1.0, "decode_s": 2.0, "compress_s": 0.0, "ttft_s": 1.5, "output_tokens": 10,
            "context_tokens": 100, "draft_tokens": 4, "accepted_tokens": 1}
    rows = [{**base, "error": None, "cached_prompt_tokens": 0}, {**base, "error": None, "cached_prompt_tokens": 90},
            {**base, "error": "generate: OSError", "cached_prompt_tokens": None},
            {**base, "error": None}]  # a row of an output written before schema version 5
    t = row_totals(rows)
    assert t["cached_prompt_tokens"] == 90 and t["output_tokens"] == 30 and t["rows_prefill_s"] == 3.0
    assert t["acceptance"] == 0.25 and t["mean_ttft_s"] == 1.5


def test_rows_read_back_carry_the_prefix_caches_tokens(tmp_path):
    """The result JSON said cached_prompt_tokens 0 of rows that had 1051 each: the reader
    of the rows did not read that column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bench.job_sides import read_rows, row_totals

    cols = {"request_id": ["a", "b"], "doc_id": ["d", "d"], "prompt": ["q", "q"], "output_text": ["x", "y"],
            "output_tokens": [3, 4], "prompt_tokens": [1100, 1100], "context_tokens": [1024, 1024],
            "e2e_s": [1.0, 1.0], "error": pa.array([None, None], pa.string()), "prefill_s": [0.5, 0.1],
            "decode_s": [0.5, 0.5], "ttft_s": [0.5, 0.1], "compress_s": [0.0, 0.0], "draft_tokens": [0, 0],
            "accepted_tokens": [0, 0], "decode_steps": [3, 4]}
    part = tmp_path / "run_date=2026-12-07"
    part.mkdir()
    pq.write_table(pa.table({**cols, "cached_prompt_tokens": [0, 1051]}), part / "part-0.parquet")
    rows = read_rows(tmp_path, "2026-12-07")
    assert row_totals(rows)["cached_prompt_tokens"] == 1051
    old = tmp_path / "old"  # an output written before the column existed: read, counted 0
    (old / "run_date=2026-12-07").mkdir(parents=True)
    pq.write_table(pa.table(cols), old / "run_date=2026-12-07" / "part-0.parquet")
    assert row_totals(read_rows(old, "2026-12-07"))["cached_prompt_tokens"] == 0


def test_a_probe_clamps_candidates_above_the_jobs_documents_with_a_note():
    """A trial's job of 9 requests probed batches 8 and 16 on the same 9 documents (44.00 s and
    44.32 s: noise picked between them)."""
    from pipeline.bench.job_sides import probe_sizes

    sizes, note = probe_sizes((1, 4, 8, 16), 9)
    assert sizes == (1, 4, 8, 9)
    assert note == "batch size 16 above the 9 documents probed (all the job has): timed as batch 9, the most its " \
                   "runs can batch"
    assert probe_sizes((1, 4, 8, 16), 4) == ((1, 4), "batch size 8,16 above the 4 documents probed (all the job "
                                                     "has): timed as batch 4, the most its runs can batch")
    assert probe_sizes((1, 4), 9) == ((1, 4), None)


def test_the_peer_makes_a_methods_cut_only_where_the_method_says_it_can():
    """The peer's context was picked by where a method runs: any tokenize-time method was
    taken for truncate, so a new one (keeping sentences, say) got the peer a head/tail cut
    and the bench called the two contexts the same. The method says it (peer_cut)."""
    from pipeline.bench.job_sides import _peer_context
    from stages.compression import registry
    from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
    from stages.compression.truncate import TruncateCompression

    class KeepsSentences(CompressionMethod):  # a tokenize method the peer cannot imitate
        name = "keeps-sentences"
        spec_model = TruncateCompression
        summary = "whole sentences"
        runs_at = "tokenize"
        adds = CONTEXT_COLUMNS

        def compress_spans(self, config, doc_ids, edges):
            return [0, 1]

    config = TruncateCompression(target_tokens=64, keep="head")
    assert _peer_context(config, KeepsSentences()) == (("full",), False)
    assert _peer_context(config) == (("truncate", 64, "head"), True)  # truncate itself: the same cut
    # Of the shipped methods only truncate's cut is the peer's; the others read it the whole document.
    cut = {m.name for m in registry().values() if _peer_context(config, m)[0][0] == "truncate"}
    assert cut == {"truncate"}
