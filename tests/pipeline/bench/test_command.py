"""`longdoc bench decode` end to end on random:tiny (no Ray importable), and its option checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pipeline.bench.command import PRESETS
from pipeline.bench.results import SYSTEMS
from pipeline.cli import app

ROOT = Path(__file__).resolve().parents[3]

# The bench must run on a GPU machine that has torch + transformers but no Ray: block
# `import ray` in the child, so any import of it on the bench path fails this test.
_CHILD = """
import runpy, sys
sys.modules["ray"] = None
sys.argv = ["pipeline/bench/command.py"] + sys.argv[1:]
runpy.run_module("pipeline.bench.command", run_name="__main__")
"""


def _run_tiny(tmp_path: Path, *extra: str) -> tuple[dict, str, str]:
    """The bench on random:tiny in a child process that cannot import Ray: (JSON, Markdown, stdout)."""
    args = ["--device", "cpu", "--model", "random:tiny", "--prompt-tokens", "256", "--out", str(tmp_path), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [js] = tmp_path.glob("decode-*-random-tiny.json")
    [md] = tmp_path.glob("decode-*-random-tiny.md")
    return json.loads(js.read_text()), md.read_text(), proc.stdout


def test_tiny_cpu_run_writes_the_json_layout_without_ray(tmp_path):
    """The CPU defaults (summary and question prompts, EOS honoured, the CPU checks) on a
    tiny model, with the verify-width probe and the nightly figures."""
    r, text, out = _run_tiny(tmp_path, "--new-tokens", "8", "--batch-sizes", "1,4", "--verify-widths", "2,4",
                             "--usd-per-device-hour", "3.6")
    assert r["bench"] == "decode" and r["layout_version"] == 2
    assert r["command"].startswith("python -m pipeline.bench.command --device cpu")
    assert r["device"]["type"] == "cpu" and r["device"]["name"] and r["device"]["bandwidth_measured_GBps"] > 0
    assert r["device"]["clock"].startswith("process_time")
    assert set(r["versions"]) >= {"torch", "transformers", "python"}
    assert r["model"]["name"] == "random:tiny" and r["model"]["weight_bytes_per_step"] > 0
    assert list(r["systems"]) == list(SYSTEMS) and r["settings"]["tasks"] == ["summarize", "qa"]
    assert r["systems"]["hf-static-compiled"] == {"status": "skipped", "reason": "not in --systems"}
    assert "slots" in r["engine"] and r["warm_up_s"] >= 0  # one engine, made and warmed up once
    assert [(rec["task"], rec["batch_size"]) for rec in r["results"]] == [
        ("summarize", 1), ("summarize", 4), ("qa", 1), ("qa", 4)]
    for rec in r["results"]:
        b, rows = rec["batch_size"], rec["rows"]
        assert rows == 4  # the CPU default: at least 4 rows per batch size (B=1: 4 batches of 1)
        assert list(rec["systems"]) == list(SYSTEMS)
        for name in ("longdoc", "longdoc-pld", "longdoc-suffix", "hf-dynamic"):
            s = rec["systems"][name]
            assert s["status"] == "ok" and 0 < s["tokens"] <= 8 * rows, (name, s)
            assert s["tok_s"] > 0 and s["decode_tok_s"] > 0 and s["first_call_s"] > 0
        hf_pld = rec["systems"]["hf-pld"]
        assert hf_pld["status"] == ("ok" if b == 1 else "skipped")
        # fp32: our drafters and transformers' greedy equal our greedy token for token.
        ag = rec["agreement_with_longdoc"]
        for name in ("longdoc-pld", "longdoc-suffix", "hf-dynamic"):
            assert ag[name]["rows_identical"] == 1.0 and ag[name]["first_divergence"] is None
        assert rec["agreement_dtype"] == "torch.float32"
        assert set(rec["step_ms"]) == {"1", "2", "4"} and all(v["ms"] > 0 for v in rec["step_ms"].values())
        assert rec["step_ms"]["1"]["mean_width"] == 1.0 and rec["step_ms"]["2"]["mean_width"] > 1.0
        assert rec["ratio_vs_hf_static_compiled"] is None  # its baseline was skipped
        assert rec["decode_ratio_vs_hf_dynamic"]["longdoc"] > 0
        assert rec["roofline"]["weights_tok_s"] >= rec["roofline"]["weights_kv_tok_s"] > 0
        # docs/hour and $/1k documents from the timed call: at $3.6/h a document costs seconds/B/1000 $.
        ni, secs = rec["nightly"]["longdoc"], rec["systems"]["longdoc"]["seconds"]
        assert abs(ni["docs_per_hour"] - 3600 * rows / secs) < 1e-6 * ni["docs_per_hour"]
        assert abs(ni["usd_per_1k_docs"] - 1000 * secs / rows * 3.6 / 3600) < 1e-9
    assert [c["check"] for c in r["cpu_checks"]][0].startswith("longdoc >= hf-dynamic")
    assert all(c["passed"] in (True, False, None) for c in r["cpu_checks"])
    assert "| batch | " + " | ".join(SYSTEMS) + " |" in text and "| qa 4 |" in text
    assert "NOT representative" in text and "## CPU checks" in text and "$3.6/device-hour" in text
    assert "# CPU checks" in out and "hf-static-compiled: skipped (not in --systems)" in out


def test_option_errors_name_the_option():
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "decode", "--device", "tpu"])
    said = " ".join(res.output.replace("│", " ").split())  # typer's refusal of an Enum option, out of its box
    assert res.exit_code == 2 and "'tpu' is not one of 'cpu', 'cuda'" in said
    res = runner.invoke(app, ["bench", "decode", "--systems", "longdoc,vllm"])
    assert res.exit_code == 2 and "allowed: a comma list of longdoc" in res.output
    res = runner.invoke(app, ["bench", "decode", "--tasks", "translate"])
    assert res.exit_code == 2 and "allowed: a comma list of summarize, qa" in res.output
    res = runner.invoke(app, ["bench", "decode", "--batch-sizes", "1,x"])
    assert res.exit_code == 2 and "comma-separated integers" in res.output
    res = runner.invoke(app, ["bench", "decode", "--compile", "cudagraphs"])
    assert res.exit_code == 2 and "needs a CUDA device" in res.output


def test_presets_name_only_known_systems_and_tasks():
    from pipeline.bench.suite import TASKS

    for device, preset in PRESETS.items():
        assert set(preset["systems"].split(",")) <= set(SYSTEMS), device
        assert set(preset["tasks"].split(",")) <= set(TASKS), device
    assert "hf-static-compiled" not in PRESETS["cpu"]["systems"]  # minutes of CPU compilation for nothing
