"""No module-level mutable state in stages/ (DESIGN: what a stage learns lives in objects
its actor owns). An AST check over every stages/ module:
- no ``global`` statement (a function rebinding module state);
- no ``functools.cache`` / ``lru_cache`` on a function with parameters (a process-wide
  memo keyed by its arguments, e.g. per model); on a function with none it is a
  lazily built constant (the compression registry) and allowed;
- a module-level dict/list/set/deque/... is a constant: nothing in its module stores
  into it, deletes from it, augments it or calls a mutating method on it.
The checker is run on a sample of the old engine's pattern to show it catches it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STAGES = Path(__file__).resolve().parents[2] / "stages"
CONTAINER_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter"}
MUTATORS = {
    "append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "remove",
    "add", "discard", "appendleft", "extendleft", "sort", "reverse", "__setitem__", "__delitem__",
}
CACHES = {"cache", "lru_cache"}


def _is_container(node: ast.expr | None) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in CONTAINER_CALLS
    return False


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_container(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and _is_container(node.value) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _has_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    return bool(a.posonlyargs or a.args or a.kwonlyargs or a.vararg or a.kwarg)


def _root(node: ast.expr) -> str | None:
    """The name a subscript/attribute chain starts from: ``_X[a][b]`` -> ``_X``."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def problems(source: str) -> list[str]:
    """Module-level mutable state in ``source``, one line per finding (empty: clean)."""
    tree = ast.parse(source)
    shared = _module_containers(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"line {node.lineno}: global {', '.join(node.names)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in CACHES and _has_params(node):
                    found.append(f"line {node.lineno}: @{name} on {node.name}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                root = _root(t)
                if root in shared and (not isinstance(t, ast.Name) or isinstance(node, ast.AugAssign)):
                    found.append(f"line {node.lineno}: {root} mutated")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            root = _root(node.func.value)
            if root in shared:
                found.append(f"line {node.lineno}: {root}.{node.func.attr}()")
    return found


OLD_ENGINE = '''
_LEARNED: dict[str, tuple] = {}
_PLANS = dict()
_SEEN = []

def learned(key):
    if key not in _LEARNED:
        _LEARNED[key] = (1, 2)
    _PLANS.setdefault(key, None)
    _SEEN += [key]
    return _LEARNED[key]

@functools.lru_cache(maxsize=None)
def plan(key):
    global _COUNT
'''


def test_the_check_catches_process_global_state():
    found = "\n".join(problems(OLD_ENGINE))
    for what in ("_LEARNED mutated", "_PLANS.setdefault()", "_SEEN mutated", "@lru_cache on plan", "global _COUNT"):
        assert what in found


def test_constants_pass():
    src = (
        "SUFFIXES = {'a': 1}\n__all__ = ['f']\n"
        "def f(x):\n    d = {}\n    d[x] = SUFFIXES['a']\n"
        "@functools.lru_cache(maxsize=1)\ndef registry():\n    return {'a': 1}\n"
    )
    assert problems(src) == []


@pytest.mark.parametrize("path", sorted(STAGES.rglob("*.py")), ids=lambda p: str(p.relative_to(STAGES)))
def test_no_module_level_mutable_state(path: Path):
    assert problems(path.read_text(encoding="utf-8")) == []
