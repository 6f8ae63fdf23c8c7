"""Building the decoding stages' C kernels (stages/decoding/backends/cpu_native/build.py): once per machine into
the cache, atomically, with the compiler's own words when it fails."""

from __future__ import annotations

import shutil

import pytest

from stages.decoding.backends.cpu_native import build as native

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "answer.c"
    src.write_text("int ld_answer(void) { return 42; }\n")
    return src


@needs_compiler
def test_a_source_is_built_once_and_reused(source, tmp_path):
    assert native.load_library(source).ld_answer() == 42
    built = sorted((tmp_path / "cache" / "kernels").glob("answer-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert native.load_library(source).ld_answer() == 42
    assert sorted((tmp_path / "cache" / "kernels").glob("answer-*.so")) == built
    assert built[0].stat().st_mtime_ns == stamp
    source.write_text("int ld_answer(void) { return 43; }\n")  # a changed source is a new build
    assert native.load_library(source).ld_answer() == 43
    assert not any((tmp_path / "cache").rglob("*.tmp"))


@needs_compiler
def test_a_failed_build_raises_with_the_compilers_words(source, tmp_path):
    source.write_text("int ld_answer(void) { return }\n")
    with pytest.raises(RuntimeError, match="(?s)failed: .*error"):
        native.load_library(source)
    assert not any((tmp_path / "cache").rglob("*.so")) and not any((tmp_path / "cache").rglob("*.tmp"))


def test_no_compiler_raises_naming_the_source(source, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native.compiler() is None
    with pytest.raises(RuntimeError, match="no C compiler.*answer.c"):
        native.load_library(source)
