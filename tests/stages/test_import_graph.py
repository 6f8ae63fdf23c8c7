"""No import circles in stages/, drawn from the code's own imports.

How the graph is drawn (so the count means one thing):
- nodes: every module of stages/ (a package is its ``__init__.py``);
- an edge A -> B for EVERY import statement in A that names B, wherever it stands: at
  module level, inside a function, or under ``if TYPE_CHECKING:``. A function-level or
  type-only import still couples the two files (one cannot move or change without the
  other), so it counts; ``from pkg import name`` is an edge to ``pkg.name`` when that is a
  module, else to ``pkg``; relative imports are resolved;
- the implicit import of a module's parent packages is not an edge (every module would
  otherwise depend on its package's ``__init__``).
A circle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Circles known today, each owned by work in progress; the list may only shrink.
KNOWN: set[frozenset[str]] = set()


def _modules(package: str = "stages") -> dict[str, Path]:
    out = {}
    for p in (ROOT / package).rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def import_graph(package: str = "stages") -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (see the module docstring)."""
    mods = _modules(package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target is not None and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def test_the_drawing_sees_every_kind_of_import() -> None:
    """The counting rule itself: module-level, function-level and type-only imports are edges."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == {frozenset({"a", "b", "c"})}
    drawn = import_graph()
    # function-level: the registry entry imports the algorithm inside load()
    assert "stages.autocompressor.prefill" in drawn["stages.compression.autocompressor"]
    # type-only (under TYPE_CHECKING): the scheduler names the request type
    assert "stages.decoding.request" in drawn["stages.decoding.scheduler"]


def test_no_import_circles_in_stages() -> None:
    found = circles(import_graph())
    new = found - KNOWN
    assert not new, "import circles in stages/: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN - found
    assert not gone, f"remove from KNOWN (no longer a circle): {[sorted(c) for c in gone]}"
