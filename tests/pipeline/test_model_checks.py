"""pipeline/model_checks.py: a local model folder that cannot load is named before anything
loads (a folder saved without its tokenizer ended every generate actor in a Ray traceback)."""

from __future__ import annotations

import shutil

from pipeline.model_checks import model_problem


def test_a_whole_folder_passes(tiny_model_dir):
    assert model_problem("generation.model", str(tiny_model_dir)) is None


def test_a_folder_without_its_tokenizer_or_weights_is_named_with_the_fix(tiny_model_dir, tmp_path):
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / f, no_tok / f)
    line = model_problem("generation.model", str(no_tok))
    assert line.startswith(f"generation.model: '{no_tok}' has no tokenizer") and "tokenizer.save_pretrained" in line
    assert model_problem("compression.embedder", str(no_tok), "embedder") is None  # not a generator's tokenizer
    (no_tok / "model.safetensors").unlink()
    line = model_problem("compression.scorer", str(no_tok), "scorer")
    assert line.startswith(f"compression.scorer: '{no_tok}' has a config.json but no weights")


def test_a_safetensors_file_cut_short_is_named(tiny_model_dir, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, cut)
    weights = cut / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])  # the tensors' end missing
    line = model_problem("generation.model", str(cut))
    assert "its weights file model.safetensors is damaged" in line and "cut short" in line, line
    weights.write_bytes(data[:1000])  # inside the header
    assert "shorter than its own header says" in model_problem("generation.model", str(cut))
    weights.write_bytes(b"\xff" * 8)
    assert "header" in model_problem("generation.model", str(cut))


def test_any_family_of_tokenizer_files_counts(tiny_model_dir, tmp_path):
    """The check is for a folder saved without a tokenizer, not a refusal of a family's layout."""
    for files in (["spiece.model"], ["sentencepiece.bpe.model"], ["qwen.tiktoken"], ["vocab.txt"],
                  ["vocab.json", "merges.txt"], ["tokenizer_config.json"]):
        folder = tmp_path / files[0]
        folder.mkdir()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(tiny_model_dir / f, folder / f)
        for f in files:
            (folder / f).write_text("x")
        assert model_problem("generation.model", str(folder)) is None, files


def test_a_cache_folder_that_cannot_be_written_is_named_before_the_model_loads(tmp_path, monkeypatch):
    """LONGDOC_CACHE=/proc/nope passed validate; run loaded, then aborted on a bare
    "FileNotFoundError: '/proc/nope'" naming neither the variable nor the fix."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LONGDOC_CACHE", str(blocker / "cache"))
    for name, what in (("embedded:smollm2-135m-instruct", "its weights"), ("random:tiny", "its tokenizer")):
        problem = model_problem("generation.model", name)
        assert problem is not None and problem.startswith(
            f"generation.model: '{name}' needs the bundled model converted into the cache folder first ({what}")
        assert "(LONGDOC_CACHE, default ~/.cache/longdoc) cannot be written" in problem
        assert "fix: set LONGDOC_CACHE to a writable folder" in problem
    assert model_problem("compression.embedder", "embedded:all-minilm-l6-v2", "embedder") is None  # from its package
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "new" / "cache"))
    assert model_problem("generation.model", "embedded:smollm2-135m-instruct") is None  # made on the way

    # The conversion writes under models/: a cache whose models/ is a file is refused too.
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "models").write_text("")
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "odd"))
    assert "cannot be written" in (model_problem("generation.model", "embedded:smollm2-135m-instruct") or "")
