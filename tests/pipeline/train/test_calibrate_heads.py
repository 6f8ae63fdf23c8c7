"""`longdoc calibrate-heads` command function: corpus -> needles -> saved head set that
Finch finds for the same model."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeline.train.calibrate_heads import calibrate_heads_command, read_texts


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("calibrate-heads")(calibrate_heads_command)
    app.command("noop")(lambda: None)  # two commands keep the subcommand name in the CLI
    return app


def _corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b", "held-out"):
        (corpus / f"{name}.txt").write_text(
            "\n".join(f"Paragraph {i} of {name}: plain words about boats and rivers." for i in range(80))
        )
    return corpus


def test_cli_writes_a_head_set_finch_finds(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path)
    args = ["calibrate-heads", "--model", str(tiny_model_dir), "--corpus", str(corpus),
            "--exclude", "held-out", "--prompts", "3", "--paraphrased", "0.34", "--haystack-tokens", "200",
            "--top-k", "3", "--max-depth", "1.0", "--threads", "1"]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    written = list((tmp_path / "cache" / "finch_heads").glob("*.json"))
    assert len(written) == 1
    data = json.loads(written[0].read_text())
    assert data["model"] == str(tiny_model_dir) and len(data["heads"]) == 3
    assert data["info"]["excluded"] == ["held-out"] and data["info"]["prompts"] == 3
    assert set(data["info"]["heads_share_by_style"]) == {"echoed", "paraphrased"}  # 2 echoed, 1 paraphrased
    assert data["fingerprint"] in result.output

    from stages.finch.heads import find_heads
    from stages.model_loading import load_causal_lm

    model, _ = load_causal_lm(str(tiny_model_dir))
    found = find_heads(model)
    assert found is not None and [list(h) for h in found.heads] == data["heads"]


def test_cli_out_file_and_bad_values(tmp_path, tiny_model_dir):
    corpus = _corpus(tmp_path)
    out = tmp_path / "ship" / "tiny.json"
    base = ["calibrate-heads", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--threads", "1"]
    ok = CliRunner().invoke(_app(), base + ["--prompts", "1", "--haystack-tokens", "150",
                                            "--top-k", "2", "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert len(json.loads(out.read_text())["heads"]) == 2
    bad = CliRunner().invoke(_app(), base + ["--prompts", "1", "--haystack-tokens", "100000"])
    assert bad.exit_code == 2 and "haystack_tokens" in bad.output
    bad = CliRunner().invoke(_app(), base + ["--prompts", "1", "--haystack-tokens", "150", "--top-k", "99"])
    assert bad.exit_code == 2 and "top_k" in bad.output


def test_read_texts_excludes_and_fails_on_empty(tmp_path):
    corpus = _corpus(tmp_path)
    assert len(read_texts(str(corpus), ["held-out"])) == 2
    with pytest.raises(ValueError, match="no .txt/.md files"):
        read_texts(str(tmp_path / "nothing"), [])
