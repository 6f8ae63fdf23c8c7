"""Results files: Markdown table, error/skip reporting, merging batch sizes across runs."""

from __future__ import annotations

import json

from pipeline.bench.results import markdown, result_paths, write_results

SYSTEMS = ["longdoc", "longdoc-pld", "hf-dynamic", "hf-static-compiled"]  # measured in these records


def _record(b: int, created: str, static_ok: bool) -> dict:
    ok = {"status": "ok", "tokens": 8 * b, "seconds": 1.0, "tok_s": 8.0 * b, "decode_tok_s": 9.0 * b,
          "ms_per_step": 12.5, "steps": 7}
    static = dict(ok, tok_s=16.0 * b) if static_ok else {"status": "error", "error": "OutOfMemoryError: CUDA"}
    return {
        "batch_size": b, "created_utc": created, "longdoc_commit": "abc1234", "prefill_s": 0.1,
        "systems": {"longdoc": dict(ok, first_call_s=1.0, warm_up_s=42.0), "longdoc-pld": dict(ok, tok_s=16.0 * b, acceptance=0.5),
                    "hf-dynamic": ok, "hf-static-compiled": static},
        "step_ms": {"1": {"ms": 12.5, "mean_width": 1.0}, "4": {"ms": 20.0, "mean_width": 3.9}},
        "agreement_with_longdoc": {"longdoc-pld": {"rows": b, "rows_identical": 1.0, "first_divergence": None},
                                   "hf-dynamic": {"rows": b, "rows_identical": 0.5, "first_divergence": 3}},
        "ratio_vs_hf_static_compiled": {"longdoc": 0.5} if static_ok else None,
        "agreement_dtype": "torch.bfloat16",
        "nightly": {"longdoc": {"docs_per_hour": 3600.0 * b, "usd_per_1k_docs": 0.6944}},
        "pld_over_greedy": 2.0, "roofline": {"weights_tok_s": 100.0 * b, "weights_kv_tok_s": 90.0 * b,
                                             "bytes_per_step": 1},
    }


def _result(created: str, sizes: list[int]) -> dict:
    return {
        "bench": "decode-systems", "layout_version": 1, "created_utc": created, "command": "longdoc bench decode",
        "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "bandwidth_measured_GBps": 3000.0,
                   "bandwidth_nominal_GBps": 3350.0, "clock": "cuda.synchronize+perf_counter", "torch_threads": 16},
        "versions": {"torch": "2.11", "transformers": "5.17", "python": "3.12", "longdoc_commit": "abc1234"},
        "model": {"name": "random:llama-8b", "parameters": 8_030_261_248, "dtype": "torch.bfloat16",
                  "weight_bytes_per_step": 15_009_849_344, "kv_bytes_per_token": 131072},
        "settings": {"usd_per_device_hour": 2.5, "prompt_tokens": 1024, "new_tokens": 128, "ignore_eos": True, "corpus": "jobs/corpus"},
        "systems": {x: {"status": "ok"} for x in SYSTEMS[:3]} | {"hf-static-compiled": {"status": "error",
                                                                                       "reason": "B=32: OOM"}},
        "engine": "eager on cuda",
        "results": [_record(b, created, static_ok=b != 32) for b in sizes],
        "notes": ["a note"],
    }


def test_markdown_shows_every_system_errors_and_ratios():
    text = markdown(_result("2026-11-23T10:00:00Z", [1, 32]))
    assert "| batch | longdoc | longdoc-pld | longdoc-suffix | hf-dynamic | hf-static-compiled | hf-pld |" in text
    assert "| 32 | 256.0 | 512.0 | – | 256.0 | error | – |" in text  # systems a record lacks: –
    assert "| 1 | 8.0 | 16.0 | – | 8.0 | 16.0 | – | 100.0 | 90.0 | 0.50 | 2.00 |" in text
    assert "hf-static-compiled: error (B=32: OOM)" in text
    assert "50%; 3" in text  # hf-dynamic agreement: half the rows, first divergence at token 3
    assert "3350 GB/s nominal" in text
    assert "| 1 | 1.0 s + 42.0 s warm-up |" in text  # the static engine's compile time, apart
    assert "## Agreement with longdoc greedy in torch.bfloat16" in text
    assert "at $2.5/device-hour (1024-token documents, 128 new tokens each)" in text
    assert "| 32 | 115,200; $0.694 | – | – | – |" in text


def test_merge_keeps_earlier_batch_sizes_of_the_same_setup(tmp_path):
    first = _result("2026-11-23T10:00:00Z", [1, 8])
    write_results(first, tmp_path)
    second = _result("2026-11-23T11:00:00Z", [8, 32])
    js, md = write_results(second, tmp_path, merge=True)
    merged = json.loads(js.read_text())
    assert [(r["batch_size"], r["created_utc"][11:13]) for r in merged["results"]] == [(1, "10"), (8, "11"),
                                                                                         (32, "11")]
    assert "Merged from earlier runs (--merge): 1 (2026-11-23T10:00:00Z" in md.read_text()
    # Another model (or without --merge): the file holds this run only.
    other = _result("2026-11-23T12:00:00Z", [32])
    write_results(other, tmp_path)
    assert [r["batch_size"] for r in json.loads(js.read_text())["results"]] == [32]
    assert result_paths(other, tmp_path)[0].name == "decode-nvidia-h100-80gb-hbm3-random-llama-8b.json"


def test_a_chosen_dtype_gets_files_of_its_own(tmp_path):
    result = _result("2026-11-23T12:00:00Z", [1])
    auto = result_paths(result, tmp_path)[0].name
    result["settings"]["dtype"] = "bfloat16"
    assert result_paths(result, tmp_path)[0].name == auto.replace(".json", "-bfloat16.json")


def test_the_nightly_table_without_a_price_says_so_instead_of_zero_dollars():
    """The decode bench has no spec: its price defaults to 0, and every cell said "$0.000"."""
    free = _result("2026-11-23T10:00:00Z", [1])
    free["settings"]["usd_per_device_hour"] = 0.0
    free["results"][0]["nightly"]["longdoc"]["usd_per_1k_docs"] = 0.0
    text = markdown(free)
    assert "$0.000" not in text and "not priced (no --usd-per-device-hour given)" in text
    assert "| 1 | 3,600; $ – | – |" in text
    cheap = _result("2026-11-23T10:00:00Z", [1])
    cheap["results"][0]["nightly"]["longdoc"]["usd_per_1k_docs"] = 0.000123
    assert "| 1 | 3,600; $0.000123 | – |" in markdown(cheap)


def test_the_header_names_a_host_cpus_vendor_model_and_isa_features():
    r = _result("2026-11-23T10:00:00Z", [1])
    assert "CPU:" not in markdown(r)  # a GPU's file: no host CPU recorded
    r["device"]["cpu"] = {"vendor": "GenuineIntel", "family": 6, "model": 167, "features": ["avx2", "avx512f"]}
    assert "CPU: GenuineIntel family 6 model 167; avx2 avx512f." in markdown(r)
    assert result_paths(r, "out")[0].name == "decode-nvidia-h100-80gb-hbm3-random-llama-8b.json"  # names unchanged
