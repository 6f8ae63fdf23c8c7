"""pipeline/studies/autocompressor_controls.py on a tiny kv-form checkpoint: the eval
conditioning and its controls per document, and the shares of the gap."""

from __future__ import annotations

import json
import math

from pipeline.studies.autocompressor_controls import main


def test_controls_on_a_tiny_kv_checkpoint(tiny_autocompressors, qa_set, tmp_path):
    out = tmp_path / "controls.json"
    result = main(["--checkpoint", str(tiny_autocompressors["kv"]), "--eval-set", str(qa_set),
                   "--continuation", "16", "--segment-tokens", "32", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert [r["id"] for r in result["rows"]] == ["doc-0", "doc-1"]
    for row in result["rows"]:
        assert 0 < row["kept"] < row["earlier"]
        assert all(math.isfinite(row[k]) for k in ("no_context", "full", "trunc", "ac", "ac_other", "ac_none"))
    assert result["compression"] > 1 and all(math.isfinite(result[k]) for k in ("gap_recovered", "page_specific"))
