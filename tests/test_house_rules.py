"""Rules of the house that no single module's test sees (infra/README.md, "Architecture"):

- jobs/ holds data only (specs, corpora, results); every tool is a module of pipeline/
  or an infra script, and `make lint` reads every Python file of the repository;
- tests mirror the tree: each module of stages/ and pipeline/ is imported (or run with
  ``python -m``) by a test in the mirrored folder of tests/;
- product code says what, not which ticket: no "issue N" references.

``UNTESTED`` and ``ISSUE_REFERENCES`` list today's known exceptions (each owned by work in
progress); they may only shrink: a module or file that leaves them must leave the list.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("stages", "pipeline", "schemas")

# Modules without a test of their own in the mirrored folder today.
UNTESTED: set[str] = set()
# Product files that still cite an issue number.
ISSUE_REFERENCES: set[str] = set()
_ISSUE = re.compile(r"\b[Ii]ssues? ?#?\d+")


def _repo_files(pattern: str) -> list[Path]:
    skip = {".venv", ".git", "out", ".bench", ".pytest_cache", "node_modules"}
    return [p for p in ROOT.rglob(pattern) if not skip & set(p.relative_to(ROOT).parts)]


def _modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"
    }  # fmt: skip


def _names_used(test: Path) -> set[str]:
    """Modules a test file imports, plus every string in it (``python -m <module>`` runs)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def untested_modules() -> set[str]:
    """Modules of stages/, pipeline/ and schemas/ that no test in their mirrored folder imports."""
    out = set()
    for name, path in _modules().items():
        mirror = ROOT / "tests" / path.relative_to(ROOT).parent
        if not any(name in _names_used(t) for t in mirror.glob("*.py")):
            out.add(name)
    return out


def test_jobs_holds_data_only():
    code = [p.relative_to(ROOT) for p in (ROOT / "jobs").rglob("*") if p.suffix in (".py", ".sh", ".ipynb")]
    assert not code, f"jobs/ holds data only; move these to pipeline/ (with a smoke test): {code}"


def test_lint_reads_every_python_file():
    makefile = (ROOT / "Makefile").read_text()
    (line,) = [ln for ln in makefile.splitlines() if "ruff check" in ln]
    linted = [arg for arg in shlex.split(line) if (ROOT / arg).is_dir()]
    unread = [p.relative_to(ROOT) for p in _repo_files("*.py") if p.relative_to(ROOT).parts[0] not in linted]
    assert not unread, f"`make lint` ({' '.join(linted)}) does not read {unread}"


def test_every_module_has_a_test_in_its_mirrored_folder():
    assert UNTESTED <= set(_modules()), f"not modules any more, drop them: {UNTESTED - set(_modules())}"
    missing = untested_modules()
    assert not missing - UNTESTED, f"no test in the mirrored tests/ folder imports {sorted(missing - UNTESTED)}"
    assert not UNTESTED - missing, f"tested now, drop them from UNTESTED: {sorted(UNTESTED - missing)}"


def test_product_code_names_no_issue_numbers():
    cited = {str(p.relative_to(ROOT)) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")
             if _ISSUE.search(p.read_text(encoding="utf-8"))}
    assert not cited - ISSUE_REFERENCES, f"say what, not which ticket: {sorted(cited - ISSUE_REFERENCES)}"
    assert not ISSUE_REFERENCES - cited, f"clean now, drop them: {sorted(ISSUE_REFERENCES - cited)}"


def test_test_files_have_unique_basenames():
    """pytest imports test files by basename (rootdir mode, no __init__.py): two files of
    one name in different folders stop the whole collection."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "same test file name twice (rename one): " + "; ".join(clashes)


def test_job_specs_and_docs_enumerate_no_registered_names():
    """A comment such as ``# none | truncate | rag | ...`` in a spec users copy goes stale
    the day a method or drafter is added (one module each, found by a registry): the
    registry lists them (`longdoc methods`), the comment points there."""
    from stages.compression import method_names
    from stages.decoding.drafters import drafter_names

    registered = set(method_names()) | set(drafter_names())
    run = re.compile(r"`?[\w-]+`?(?:\s*\|\s*`?[\w-]+`?){2,}")  # a | b | c ...
    found = []
    for path in sorted([*(ROOT / "jobs").rglob("*.yaml"), *(ROOT / "jobs").rglob("*.md")]):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("|"):  # a Markdown table row, not an enumeration
                continue
            for match in run.finditer(line):
                names = {n.strip("` ") for n in match.group().split("|")}
                if len(names & registered) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {match.group()}")
    assert found == [], f"these list registered names by hand; point to `longdoc methods` instead: {found}"
