"""stages/cache_paths.py: the one spelling of the cache folders, read without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stages.cache_paths import EMBEDDED_DIR_NAME, cache_dir, embedded_model_folder

ROOT = Path(__file__).resolve().parents[2]


def test_the_cache_follows_longdoc_cache_read_at_each_call(monkeypatch, tmp_path):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    assert embedded_model_folder() == tmp_path / "c" / "models" / EMBEDDED_DIR_NAME
    monkeypatch.setenv("LONGDOC_CACHE", "~/c")  # as a job's environment passes it: no shell expanded it
    assert cache_dir() == Path.home() / "c"
    monkeypatch.delenv("LONGDOC_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "longdoc"


def test_the_loader_and_the_quick_checks_read_the_same_folder(monkeypatch, tmp_path):
    """model_loading converts the bundled model where the refusals before a load look for it."""
    from stages import model_loading

    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    assert model_loading.cache_dir() == cache_dir()
    folder = embedded_model_folder()
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text("{}")
    assert model_loading.embedded_tokenizer_dir() == folder


def test_it_imports_no_torch():
    code = "import sys, stages.cache_paths, pipeline.model_checks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
