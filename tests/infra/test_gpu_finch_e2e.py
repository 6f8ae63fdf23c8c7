"""infra/gpu/finch_e2e.py on the CPU with a tiny model: full vs Finch, prefill + decode,
through the decode engine (the GPU session's part c, dry)."""

from __future__ import annotations

import json

import pytest
from gpu_scripts import gpu_script

finch_e2e = gpu_script("finch_e2e")


def test_full_and_finch_end_to_end_on_cpu(tmp_path, capsys):
    out = tmp_path / "finch-e2e.json"
    result = finch_e2e.main(["--device", "cpu", "--model", "random:tiny", "--compile", "off",
                             "--doc-tokens", "300", "--target", "64", "--chunk", "32", "--new-tokens", "4",
                             "--repeats", "1", "--min-span", "64", "--out", str(out)])
    assert json.loads(out.read_text())["median"] == result["median"]
    assert result["doc_tokens"] == 300 and result["prompt_tokens"] > 300 and result["device"] == "cpu"
    for method in ("full", "finch"):
        (run,) = result["runs"][method]
        assert run["new_tokens"] == 4  # EOS ignored: fixed work
        assert 0 < run["prefill_s"] <= run["e2e_s"]
    assert result["finch_over_full_e2e"] == pytest.approx(result["median"]["finch"]["e2e_s"] /
                                                          result["median"]["full"]["e2e_s"])
    assert "1 slots" in result["engine"]
    assert "| finch |" in capsys.readouterr().out


def test_bad_values_are_refused_before_loading():
    with pytest.raises(ValueError, match="--repeats 0"):
        finch_e2e.main(["--device", "cpu", "--repeats", "0", "--model", "no-such-model"])
