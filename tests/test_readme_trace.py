"""infra/README.md's "Trace one request" names real functions, and imports run one way.

Every `module:qualname` in that section (under "Architecture") must import and
resolve, so moving or renaming a function on the request path fails here until the
README follows. The layer rule (pipeline -> stages -> schemas) is checked on the
source of every module.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "infra" / "README.md").read_text(encoding="utf-8")
SECTION = README.split("### Trace one request", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
NAMES = sorted(set(re.findall(r"`((?:schemas|stages|pipeline)(?:\.\w+)*:[\w.]+)`", SECTION)))


def test_the_trace_names_enough_steps() -> None:
    assert len(NAMES) >= 20, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_traced_name_resolves(name: str) -> None:
    module_name, qualname = name.split(":")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        assert hasattr(obj, part), f"README names {name}, but {part!r} is not in {obj!r}"
        obj = getattr(obj, part)
    assert callable(obj), f"README names {name}, which is not a function or class"


LAYER = {"schemas": 0, "stages": 1, "pipeline": 2}


@pytest.mark.parametrize("top", sorted(LAYER))
def test_imports_run_one_way(top: str) -> None:
    bad = []
    for path in sorted((ROOT / top).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            )
            for mod in mods:
                head = mod.split(".")[0]
                if head in LAYER and LAYER[head] > LAYER[top]:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {mod}")
    assert bad == []
