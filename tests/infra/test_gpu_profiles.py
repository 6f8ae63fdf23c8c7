"""infra/gpu/step_profile.py, kernel_profile.py and linear_fusion_probe.py dry on the CPU with a tiny model."""

from __future__ import annotations

import json

from gpu_scripts import gpu_script


def test_step_profile_on_cpu(tmp_path):
    step_profile = gpu_script("step_profile")
    out = tmp_path / "step.json"
    report = step_profile.main(["--model", "random:tiny", "--slots", "2", "--capacity", "96", "--device", "cpu",
                                "--compile", "off", "--prompt-tokens", "16", "--new-tokens", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    (run,) = report["runs"]
    assert run["compile"] == "off" and report["device"] == "cpu"
    assert {(b["batch"], b["width"]) for b in run["bare"]} >= {(2, 1), (2, 8)}
    assert all(b["async_ms"] > 0 and b["sync_ms"] > 0 for b in run["bare"])
    assert run["engine_ms_b1"] > 0 and run["engine_ms_b2"] > 0


def test_kernel_profile_on_cpu(capsys):
    kernel_profile = gpu_script("kernel_profile")
    result = kernel_profile.main(["--model", "random:tiny", "--slots", "2", "--capacity", "64", "--device", "cpu"])
    assert result["ms_per_step"] > 0
    assert "aten::" in result["table"]  # the step's operators, by time
    assert "CPU" in capsys.readouterr().out


def test_kernel_profile_of_a_prefill_on_cpu(capsys):
    kernel_profile = gpu_script("kernel_profile")
    result = kernel_profile.main(["--model", "random:tiny", "--slots", "1", "--capacity", "200", "--device", "cpu",
                                  "--prefill-tokens", "100"])
    assert result["prefill_ms"] > 0 and result["tokens_per_s"] > 0 and result["tflops"] > 0
    assert "aten::" in result["table"]
    assert "prefill of 100 tokens" in capsys.readouterr().out


def test_the_prefill_flops_estimate_of_llama_3_8b():
    from stages.random_models import random_config

    kernel_profile = gpu_script("kernel_profile")
    config = random_config("random:llama-8b")
    # 6.98 B non-embedding parameters: 2 FLOPs each per token; 8,000 tokens of causal attention
    linear = 2 * 6_979_321_856 * 8000 + 2 * 4096 * 128256
    attention = 2 * 8000**2 * 4096 * 32
    assert kernel_profile.prefill_flops(config, 8000) == linear + attention


def test_linear_fusion_probe_on_cpu(capsys):
    probe = gpu_script("linear_fusion_probe")
    results = probe.main(["--model", "random:tiny", "--dtype", "float32", "--batch-sizes", "1,4",
                          "--repeats", "3", "--device", "cpu"])
    assert [r["batch"] for r in results] == [1, 4]
    # random:tiny: 2 layers of hidden 64, 2 of 4 heads' keys and values, intermediate 128, fp32
    per_layer = 64 * 64 * 2 + 2 * (32 * 64) + 3 * (128 * 64)
    assert all(r["weights_gb"] == 2 * per_layer * 4 / 1e9 for r in results)
    assert all(r["separate_ms"] > 0 and r["fused_ms"] > 0 and r["fused_gb_s"] > 0 for r in results)
    assert len(capsys.readouterr().out.strip().splitlines()) == 2  # one JSON line per batch size
