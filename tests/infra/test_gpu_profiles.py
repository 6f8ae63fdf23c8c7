"""infra/gpu/step_profile.py and kernel_profile.py dry on the CPU with a tiny model."""

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
