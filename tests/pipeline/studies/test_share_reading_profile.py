"""The shared-reading profile runs both modes and names the reading pass (smoke test)."""

from __future__ import annotations

import json

from pipeline.studies.share_reading_profile import main


def test_both_modes_profile_one_call_over_every_question(tmp_path, qa_set, tiny_model_dir):
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "profile", "input": {"uri": str(qa_set), "format": "jsonl", "question_field": "questions"},
        "task": {"kind": "qa"},
        "compression": {"method": "select", "target_tokens": 64, "chunk_tokens": 32, "evidence": "heads",
                        "max_scoring_layers": 1},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
        "output": {"uri": str(tmp_path / "out")},
    }))
    for mode in ("share", "noshare"):
        out = tmp_path / f"{mode}.txt"
        main([mode, "--spec", str(spec), "--threads", "1", "--max-doc-tokens", "200", "--out", str(out)])
        text = out.read_text()
        assert text.startswith("doc tokens 200 questions 2") and "read_shared" in text
        calls = next(ln for ln in text.splitlines() if ln.rstrip().endswith("(read_shared)")).split()[0]
        assert calls == ("1" if mode == "share" else "2")  # one reading, or one per question
        # The decoder's passes by shape: the 32-token chunks read once per call (one document).
        passes = text.split("forward passes (rows x tokens, layers): seconds, calls\n")[1].split("  all passes")[0]
        chunk_calls = [int(ln.rsplit(", ", 1)[1]) for ln in passes.splitlines() if ln.startswith("  1 x 32,")]
        assert sum(chunk_calls) == (6 if mode == "share" else 12)  # 200 tokens: 6 full chunks per reading
