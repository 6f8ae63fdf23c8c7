"""What a checkpoint folder says before any model loads (stages/autocompressor/checkpoint_files.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stages.autocompressor.checkpoint_files import CONFIG_FILE, checkpoint_problems, same_model


def test_a_checkpoint_that_cannot_serve_the_job_is_named_before_any_model_loads(tmp_path, method_env, monkeypatch):
    """checkpoint_problems reads the folder only: another model's checkpoint, a base that is not
    here, an unfinished training run, a folder of neither format, another summary form."""
    model = str(method_env.model_dir)
    ckpt = method_env.required["checkpoint"]
    assert checkpoint_problems(ckpt, model) == []
    (other,) = checkpoint_problems(ckpt, "embedded:smollm2-135m-instruct")
    assert f"was trained on {model!r}, but generation.model is 'embedded:smollm2-135m-instruct'" in other
    assert f"fix: --set generation.model={model}" in other
    # A base saved as a relative path (older checkpoints) and read from another folder.
    moved = tmp_path / "moved"
    moved.mkdir()
    meta = json.loads((Path(ckpt) / CONFIG_FILE).read_text())
    (moved / CONFIG_FILE).write_text(json.dumps({**meta, "base_model": "models/tiny-llama"}))
    monkeypatch.chdir(tmp_path)
    (gone,) = checkpoint_problems(str(moved), "/elsewhere/models/tiny-llama")  # the same model, named absolutely
    assert "its base model 'models/tiny-llama' is not on this machine" in gone and "absolute path" in gone
    # a base named by a hub id not downloaded yet: the generator's own checks decide (it may download)
    (moved / CONFIG_FILE).write_text(json.dumps({**meta, "base_model": "someorg/some-model"}))
    assert checkpoint_problems(str(moved), "someorg/some-model") == []
    (hub,) = checkpoint_problems(str(moved), "otherorg/other-model")
    assert "was trained on 'someorg/some-model', but generation.model is 'otherorg/other-model'" in hub
    unfinished = tmp_path / "unfinished"
    (unfinished / "last").mkdir(parents=True)
    (half,) = checkpoint_problems(str(unfinished), model)
    assert "is an unfinished training run" in half and f"--out {unfinished} --resume" in half and "--export" in half
    (neither,) = checkpoint_problems(str(tmp_path), model)
    assert "is neither a folder saved by `longdoc train-autocompressor`" in neither
    (form,) = checkpoint_problems(ckpt, model, "kv")
    assert "is of summary form 'vectors', but compression.summary_form is 'kv'" in form


def test_the_questions_about_a_checkpoint_import_no_torch():
    """validate and run ask them before any model loads: torch's import would cost seconds."""
    code = "import sys, stages.autocompressor.checkpoint_files; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_two_names_of_one_folder_are_one_model(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert same_model("m", str(tmp_path / "m")) and same_model("embedded:x", "embedded:x")
    assert not same_model("m", "embedded:x") and not same_model("a/b", "a/c")
