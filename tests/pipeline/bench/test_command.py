"""`longdoc bench decode --suite systems` end to end on random:tiny, and its option checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from typer.testing import CliRunner

from pipeline.bench.slot_systems import resolve_engine
from pipeline.cli import app

ROOT = Path(__file__).resolve().parents[3]
SYSTEMS = ["longdoc", "longdoc-pld", "hf-dynamic", "hf-static-compiled"]

# The bench must run on a GPU machine that has torch + transformers but no Ray: block
# `import ray` in the child, so any import of it on the bench path fails this test.
_CHILD = """
import runpy, sys
sys.modules["ray"] = None
sys.argv = ["pipeline/bench/command.py"] + sys.argv[1:]
runpy.run_module("pipeline.bench.command", run_name="__main__")
"""


def _run_tiny(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    """The systems bench on random:tiny in a child process that cannot import Ray: (JSON, Markdown)."""
    args = ["--device", "cpu", "--model", "random:tiny", "--batch-sizes", "1,4", "--prompt-tokens", "256",
            "--systems", "longdoc,longdoc-pld,hf-dynamic", "--out", str(tmp_path), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hf-static-compiled: skipped (not in --systems)" in proc.stdout
    [js] = tmp_path.glob("decode-*-random-tiny.json")
    [md] = tmp_path.glob("decode-*-random-tiny.md")
    return json.loads(js.read_text()), md.read_text()


def test_tiny_cpu_run_writes_the_json_layout_without_ray(tmp_path):
    r, text = _run_tiny(tmp_path, "--new-tokens", "8", "--verify-widths", "2,4", "--engine", "dynamic")

    assert r["bench"] == "decode-systems" and r["layout_version"] == 1
    assert r["command"].startswith("python -m pipeline.bench.command --device cpu")
    assert r["device"]["type"] == "cpu" and r["device"]["name"] and r["device"]["bandwidth_measured_GBps"] > 0
    assert r["device"]["clock"].startswith("process_time")
    assert set(r["versions"]) >= {"torch", "transformers", "python"}
    assert r["model"]["name"] == "random:tiny" and r["model"]["weight_bytes_per_step"] > 0
    assert list(r["systems"]) == SYSTEMS
    assert r["systems"]["hf-static-compiled"] == {"status": "skipped", "reason": "not in --systems"}
    assert [rec["batch_size"] for rec in r["results"]] == [1, 4]
    for rec in r["results"]:
        b = rec["batch_size"]
        assert list(rec["systems"]) == SYSTEMS
        for name in SYSTEMS[:3]:
            s = rec["systems"][name]
            assert s["status"] == "ok" and s["tokens"] == 8 * b, (name, s)
            assert s["tok_s"] > 0 and s["ms_per_step"] > 0 and s["first_call_s"] > 0
        assert rec["systems"]["hf-static-compiled"]["status"] == "skipped"
        # fp32: prompt lookup and transformers' greedy equal our greedy token for token.
        ag = rec["agreement_with_longdoc"]
        assert ag["longdoc-pld"]["rows_identical"] == 1.0 and ag["longdoc-pld"]["first_divergence"] is None
        assert ag["hf-dynamic"]["rows_identical"] == 1.0
        assert set(rec["step_ms"]) == {"1", "2", "4"} and all(v["ms"] > 0 for v in rec["step_ms"].values())
        assert rec["step_ms"]["1"]["mean_width"] == 1.0 and rec["step_ms"]["2"]["mean_width"] > 1.0
        assert rec["ratio_vs_hf_static_compiled"] is None  # its baseline was skipped
        assert rec["roofline"]["weights_tok_s"] >= rec["roofline"]["weights_kv_tok_s"] > 0
    assert "| batch | longdoc | longdoc-pld | hf-dynamic | hf-static-compiled |" in text
    assert "NOT representative" in text
    assert r["engine_kind"] == "dynamic" and r["engine"].startswith("dynamic: ")


def test_tiny_cpu_run_on_the_static_slot_engine(tmp_path):
    r, text = _run_tiny(tmp_path, "--new-tokens", "24", "--verify-widths", "2", "--engine", "static",
                        "--usd-per-device-hour", "3.6")
    assert r["engine_kind"] == "static" and r["settings"]["engine"] == "static"
    assert r["engine"].startswith("static: static slots (4 x ") and "eager) on cpu" in r["engine"]
    assert r["warm_up_s"] >= 0  # one engine (slots for the largest batch), warmed up once
    assert list(r["systems"]) == SYSTEMS and [rec["batch_size"] for rec in r["results"]] == [1, 4]
    for rec in r["results"]:
        b = rec["batch_size"]
        assert list(rec["systems"]) == SYSTEMS
        for name in ("longdoc", "longdoc-pld"):
            s = rec["systems"][name]
            assert s["status"] == "ok" and s["tokens"] == 24 * b, (name, s)
            assert s["engine"].startswith("static slots (4 x ")
        assert "warm_up_s" not in rec["systems"]["hf-dynamic"]
        # Drafts were fed and accepted, so PLD = greedy is a real check (fp32: exact); the
        # adaptive width feeds mostly drafts it trusts, so rejections are rare here (their
        # rollback is tested in tests/stages/decoding/test_slot_engine.py).
        pld = rec["systems"]["longdoc-pld"]
        assert pld["drafted"] > 0 and 0 < pld["accepted"] <= pld["drafted"]
        assert rec["agreement_dtype"] == "torch.float32"
        ag = rec["agreement_with_longdoc"]
        assert ag["longdoc-pld"]["rows_identical"] == 1.0 and ag["longdoc-pld"]["first_divergence"] is None
        assert ag["hf-dynamic"]["rows_identical"] == 1.0
        assert rec["step_ms"]["2"]["mean_width"] > 1.0
        # docs/hour and $/1k documents from the timed call: at $3.6/h a document costs seconds/B/1000 $.
        for name in SYSTEMS[:3]:
            ni, secs = rec["nightly"][name], rec["systems"][name]["seconds"]
            assert abs(ni["docs_per_hour"] - 3600 * b / secs) < 1e-6 * ni["docs_per_hour"]
            assert abs(ni["usd_per_1k_docs"] - 1000 * secs / b * 3.6 / 3600) < 1e-9
    assert "## Nightly job (derived)" in text and "$3.6/device-hour" in text
    assert "Agreement with longdoc greedy in torch.float32" in text


def test_option_errors_name_the_option():
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "decode", "--suite", "systems", "--docs", "3"])
    assert res.exit_code != 0 and "--docs do not apply to --suite systems" in res.output
    res = runner.invoke(app, ["bench", "decode", "--device", "tpu"])
    assert res.exit_code == 2 and "allowed: cpu, cuda" in res.output
    res = runner.invoke(app, ["bench", "decode", "--device", "cpu", "--systems", "longdoc,vllm"])
    assert res.exit_code == 2 and "allowed: a comma list of longdoc" in res.output
    res = runner.invoke(app, ["bench", "decode", "--device", "cpu", "--engine", "graphs"])
    assert res.exit_code == 2 and "--engine 'graphs': allowed: auto, dynamic, static" in res.output
    res = runner.invoke(app, ["bench", "decode", "--suite", "cpu-targets", "--engine", "static"])
    assert res.exit_code != 0 and "--engine do not apply to --suite cpu-targets" in res.output


def test_auto_engine_is_static_on_cuda_dynamic_on_cpu():
    assert resolve_engine("auto", torch.device("cpu")) == "dynamic"
    assert resolve_engine("auto", torch.device("cuda")) == "static"
    assert resolve_engine("static", torch.device("cpu")) == "static"
