"""Every measured figure in the READMEs (README.md, infra/README.md and jobs/results/README.md,
where the measurements are told) is in the committed result file it cites.

The convention, for whoever adds a figure to a README:

- A measured figure sits in a paragraph, list item or table row that links the committed
  result file it comes from, as a Markdown link relative to the README's own folder to a
  file under ``jobs/results/`` or ``jobs/eval/results/`` (from README.md:
  ``jobs/results/bench-job/x.md``; from infra/README.md: ``../jobs/results/...``; from
  jobs/results/README.md: ``bench-job/x.md`` or ``../eval/results/x.md``), and says where it was
  measured: the date (YYYY-MM-DD), the commit (``commit <hash>``; a bench file's header
  ``longdoc <hash>`` counts) and the device (CPU, GPU, H100, ...), each either beside the
  figure or inside the cited file, e.g.
  ``0.94x greedy (H100, 2026-11-24, commit 8f147ad, [table](jobs/results/bench-decode/x.md))``.
  A table row may rely on the links of the paragraph just above its table (the caption).
- The cited file (Markdown, JSON, CSV or text; a plot cannot be read) holds the number as
  the README writes it, up to formatting: 0.625 / 0.6250, 1.19x / 1.19, 56% / 56.0% / 0.56
  (a percentage may be a fraction in the file), 31,778 / 31778. A raw value with at least
  two more decimals than the README shows may be rounded to it (1.06x from 1.0575, 57% from
  0.5717); one more decimal is not enough, so a rounded figure is quoted at the precision of
  its table (55.7% / 0.557, not 56%), and a neighbouring number (0.925 in a price column)
  does not pass for 0.93x. Matching is per block: a figure passes when any file the block
  cites holds it. The file must be committed (tracked by git, staged is enough) and a cited
  commit must exist.
- Figures still to come (the report part of `longdoc eval` per question style, `longdoc
  bench job` tables in jobs/results/bench-job/, CPU `bench decode` tables) follow the same
  rule; a table copied from a result file can carry ``<!-- measured -->`` in its caption so
  that every number of its rows is checked.

What counts as a figure (in the text outside code spans, code blocks, HTML comments and link
targets):

- a ratio: a number followed by ``x`` (``1.19x``, ``10x``);
- a percentage (``56%``);
- a number with three or more decimals (``0.625``, ``1.268``): scores and timings;
- a rate: a number followed by tok/s, tokens/s, docs/s, rows/s, docs/hour or documents/hour;
- in a block holding the marker ``<!-- measured -->`` (or a table row whose caption holds
  it): every number except dates and commit hashes.

Not figures: settings and limits, which are written as code (``0.85``, ``256``) or carry no
figure form above (0.85 in prose, 64 MiB, 30 s); targets, i.e. a number right after a
comparison (``>= 1.5x``, ``<= 0.7x``); estimates and arithmetic, written after ``~``
(``~20 s``, ``~8x``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "infra/README.md", "jobs/results/README.md")
RESULT_DIRS = ("jobs/results", "jobs/eval/results")
MEASURED_MARKER = "<!-- measured -->"
TEXT_SUFFIXES = (".md", ".json", ".csv", ".txt")

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# Each pattern's group 1 is the number; "(?<![\w.,-])" keeps versions, ids and hashes out.
_FIGURE_PATTERNS = (
    re.compile(rf"(?<![\w.,-])({_NUM})x\b"),
    re.compile(rf"(?<![\w.,-])({_NUM}) ?%"),
    re.compile(r"(?<![\w.,-])(\d+\.\d{3,})(?![\d.]*\d)"),
    re.compile(
        rf"(?<![\w.,-])({_NUM}) ?(?:tok/s|tokens/s|docs/s|rows/s|docs/hour|documents/hour)\b"
    ),
)
_ANY_NUMBER = re.compile(rf"(?<![\w.,-])({_NUM})(?![\w])")
_NOT_MEASURED_BEFORE = re.compile(r"(?:>=|<=|≥|≤|<|(?<!-)>|~)\s*$")
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d(?:T[\d:.]+Z?)?\b")
_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_COMMIT = re.compile(r"\b(?:commit|longdoc) ([0-9a-f]{7,40})\b")
_DEVICE = re.compile(r"\b(?:cpu|gpu|h100|h200|a100|nvidia|xeon|cuda)\b", re.IGNORECASE)
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_FILE_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Block:
    """A paragraph, list item, heading or table row of a Markdown file.

    ``caption`` is the text of the block just above a table row's table ("" for the rest):
    its links cite for the row.
    """

    line: int
    text: str
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    """One figure as written (``text``, e.g. "1.19x") and its number (``value``, decimals kept)."""

    text: str
    value: Decimal
    percent: bool


def blocks(markdown: str) -> list[Block]:
    """Split Markdown into blocks; fenced code is dropped, each list item and table row is one."""
    out: list[Block] = []
    current: list[str] = []
    start = 0
    caption = ""
    in_fence = False
    in_table = False

    def flush() -> None:
        nonlocal current
        if current:
            out.append(Block(start, "\n".join(current)))
        current = []

    for number, line in enumerate(markdown.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if stripped.startswith("|"):
            if not in_table:
                flush()
                caption = (
                    out[-1].text
                    if out and out[-1].line + out[-1].text.count("\n") >= number - 2
                    else ""
                )
                in_table = True
            if not re.fullmatch(r"\|[\s|:-]*", stripped):
                out.append(Block(number, stripped, caption))
            continue
        in_table = False
        if not stripped:
            flush()
            continue
        if stripped.startswith("#") or re.match(r"([-*+]|\d+\.)\s", stripped):
            flush()
        if not current:
            start = number
        current.append(line)
        if stripped.startswith("#"):
            flush()
    flush()
    return out


def visible_text(text: str) -> str:
    """The prose a reader sees as figures: no comments, code spans, link targets or path-like link text."""
    text = _COMMENT.sub(" ", text)
    text = _CODE_SPAN.sub(" ", text)
    return _LINK.sub(lambda m: " " if "/" in m.group(1) else m.group(1), text)


def figures(block: Block) -> list[Figure]:
    """The measured figures of a block, by the rules of the module docstring."""
    text = visible_text(block.text)
    measured = MEASURED_MARKER in block.text or MEASURED_MARKER in block.caption
    if measured:
        text = _HASH.sub(" ", _DATE.sub(" ", text))
    found: dict[int, Figure] = {}
    patterns = _FIGURE_PATTERNS + ((_ANY_NUMBER,) if measured else ())
    for pattern in patterns:
        for match in pattern.finditer(text):
            if match.start(1) in found or _NOT_MEASURED_BEFORE.search(text[: match.start(1)]):
                continue
            value = Decimal(match.group(1).replace(",", ""))
            found[match.start(1)] = Figure(
                match.group(0).strip(), value, match.group(0).rstrip().endswith("%")
            )
    return [found[k] for k in sorted(found)]


def cited_files(block: Block, readme_dir: Path, root: Path) -> list[Path]:
    """Result files (under RESULT_DIRS of ``root``) linked by the block or its table's caption."""
    out = []
    for _, target in _LINK.findall(block.text + "\n" + block.caption):
        path = (readme_dir / target.split("#", 1)[0]).resolve()
        inside = any(path.is_relative_to((root / d).resolve()) for d in RESULT_DIRS)
        if inside and path not in out:
            out.append(path)
    return out


@cache
def _file_numbers(path: Path) -> tuple[Decimal, ...]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return tuple(Decimal(n.replace(",", "")) for n in _FILE_NUMBER.findall(text))


def _decimals(number: Decimal) -> int:
    exponent = number.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def holds(path: Path, figure: Figure) -> bool:
    """Whether the file holds the figure's number: equal, or a raw value (2+ more decimals) rounding to it."""
    shown = _decimals(figure.value)
    half = Decimal(5).scaleb(-shown - 1)
    for number in _file_numbers(path):
        for candidate in (number, number.scaleb(2)) if figure.percent else (number,):
            if candidate == figure.value:
                return True
            if _decimals(candidate) >= shown + 2 and abs(candidate - figure.value) <= half:
                return True
    return False


def problems(
    readme: Path,
    root: Path,
    tracked: set[Path] | None = None,
    commit_exists: Callable[[str], bool] | None = None,
) -> list[str]:
    """Every broken citation of one README, as 'file:line: what'; [] when all hold.

    ``tracked``: the files git tracks (None: not checked); ``commit_exists``: whether a hash
    names a commit (None: not checked).
    """
    found = []
    name = readme.relative_to(root) if readme.is_relative_to(root) else readme
    for block in blocks(readme.read_text(encoding="utf-8")):
        figs = figures(block)
        if not figs:
            continue
        where = f"{name}:{block.line}"
        files = cited_files(block, readme.parent, root)
        if not files:
            found.append(
                f"{where}: {', '.join(f.text for f in figs)}: no result file cited "
                f"(link one under {' or '.join(RESULT_DIRS)})"
            )
            continue
        missing = [f for f in files if not f.is_file()]
        untracked = [f for f in files if tracked is not None and f.is_file() and f not in tracked]
        for f in missing:
            found.append(f"{where}: cites {f.relative_to(root)}, which does not exist")
        for f in untracked:
            found.append(
                f"{where}: cites {f.relative_to(root)}, which is not committed (git add it)"
            )
        for f in files:
            if f.is_file() and f.suffix not in TEXT_SUFFIXES:
                found.append(
                    f"{where}: cites {f.relative_to(root)}, not a text table "
                    f"({', '.join(TEXT_SUFFIXES)}): cite the table beside it"
                )
        present = [f for f in files if f.is_file() and f.suffix in TEXT_SUFFIXES]
        if not present:
            continue
        for fig in figs:
            if not any(holds(f, fig) for f in present):
                cited = ", ".join(str(f.relative_to(root)) for f in present)
                found.append(f"{where}: {fig.text} is in none of the files it cites ({cited})")
        context = (
            block.text
            + block.caption
            + "".join(f.read_text(encoding="utf-8", errors="replace") for f in present)
        )
        for what, pattern in (
            ("date (YYYY-MM-DD)", _DATE),
            ("commit (`commit <hash>`)", _COMMIT),
            ("device (CPU, GPU, H100, ...)", _DEVICE),
        ):
            if not pattern.search(context):
                found.append(f"{where}: neither the text nor its result files name the {what}")
        for commit in _COMMIT.findall(block.text + block.caption):
            if commit_exists is not None and not commit_exists(commit):
                found.append(f"{where}: commit {commit} is not a commit of this repository")
    return found


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("git") is None:
        return None
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _tracked() -> set[Path] | None:
    listed = _git("ls-files", "-z", "--", *RESULT_DIRS)
    if listed is None or listed.returncode != 0:
        return None  # not a git checkout (e.g. an unpacked release): the rest still holds
    return {(ROOT / p).resolve() for p in listed.stdout.split("\0") if p}


def _commit_exists(commit: str) -> bool:
    done = _git("cat-file", "-e", f"{commit}^{{commit}}")
    return done is None or done.returncode == 0


@pytest.mark.parametrize("readme", READMES)
def test_every_readme_figure_is_in_the_result_file_it_cites(readme: str) -> None:
    tracked = _tracked()
    found = problems(ROOT / readme, ROOT, tracked, _commit_exists if tracked is not None else None)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(("readme", "at_least"), [("README.md", 5), ("jobs/results/README.md", 100)])
def test_the_readmes_state_measured_figures(readme: str, at_least: int) -> None:
    # The rules must keep finding the READMEs' figures; a parser that finds none passes vacuously.
    figs = [f for b in blocks((ROOT / readme).read_text(encoding="utf-8")) for f in figures(b)]
    assert len(figs) >= at_least, figs


# ---- the rules on small synthetic READMEs -------------------------------------------------------


def _repo(tmp_path: Path, readme: str, results: dict[str, str]) -> Path:
    for rel, text in results.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    return tmp_path / "README.md"


RESULT = "jobs/results/bench.md"
RESULT_TEXT = (
    "# bench, 2026-11-24, longdoc 8f147ad, NVIDIA H100\n| 8 | 0.6250 | 1.1903 | 0.56 | 31778 |\n"
)


def test_a_cited_figure_found_in_its_file_passes(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path,
        (f"Scores 0.625, 1.19x faster, 56% of the gap, 31,778 docs/hour ([table]({RESULT})).\n"),
        {RESULT: RESULT_TEXT},
    )
    assert problems(readme, tmp_path) == []


def test_a_figure_missing_from_its_file_fails(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path, f"Prompt lookup is 1.50x greedy ([table]({RESULT})).\n", {RESULT: RESULT_TEXT}
    )
    found = problems(readme, tmp_path)
    assert len(found) == 1 and "1.50x is in none of the files it cites" in found[0], found


def test_a_figure_without_a_citation_fails(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path, "Intro.\n\n- finch scores 0.625 on CPU, 2026-11-24.\n", {RESULT: RESULT_TEXT}
    )
    assert problems(readme, tmp_path) == [
        "README.md:3: 0.625: no result file cited "
        "(link one under jobs/results or jobs/eval/results)"
    ]


def test_links_resolve_against_the_readmes_own_folder(tmp_path: Path) -> None:
    results = tmp_path / "jobs" / "results"
    results.mkdir(parents=True)
    (results / "bench.md").write_text(RESULT_TEXT, encoding="utf-8")
    (tmp_path / "jobs" / "eval" / "results").mkdir(parents=True)
    (tmp_path / "jobs" / "eval" / "results" / "e.md").write_text(RESULT_TEXT, encoding="utf-8")
    readme = results / "README.md"
    readme.write_text(
        "Scores 0.625 ([t](bench.md)); 1.19x ([t](../eval/results/e.md)).\n\n"
        "And 0.625 ([wrong folder](jobs/results/bench.md)).\n",
        encoding="utf-8",
    )
    found = problems(readme, tmp_path)
    # The first paragraph's links resolve from jobs/results/; the second's, written from the
    # repository root, name a file that is not there.
    assert found == [
        "jobs/results/README.md:3: cites jobs/results/jobs/results/bench.md, which does not exist"
    ], found


def test_a_plot_is_no_citation(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path,
        "H100, 2026-11-24, commit 8f147ad: 1.19x ([plot](jobs/results/b.png)).\n",
        {"jobs/results/b.png": "1.19"},
    )
    found = problems(readme, tmp_path)
    assert any("b.png, not a text table" in p for p in found), found


def test_a_missing_or_uncommitted_file_fails(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path,
        "A 1.19x speed-up ([t](jobs/results/gone.md)), 0.625 ([t](jobs/results/bench.md)).\n",
        {RESULT: RESULT_TEXT},
    )
    found = problems(readme, tmp_path, tracked=set())
    assert any("gone.md, which does not exist" in p for p in found), found
    assert any("bench.md, which is not committed" in p for p in found), found


def test_provenance_is_named(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path,
        "Scores 0.625 ([t](jobs/eval/results/x.md)), commit abcdef1.\n",
        {"jobs/eval/results/x.md": "| finch | 0.625 |\n"},
    )
    found = problems(readme, tmp_path, commit_exists=lambda c: False)
    assert any("date" in p for p in found) and any("device" in p for p in found), found
    assert any("commit abcdef1 is not a commit" in p for p in found), found


def test_settings_targets_and_estimates_are_not_figures() -> None:
    text = (
        "Slots: `0.85` of the free memory, 0.25 on CPU, at most 256; 64 MiB per call; a line every 30 s; "
        "~20 s to convert, ~8x more slots; target >= 1.5x and <= 0.7x, >= 80%; Ray 2.60, KubeRay v1.6.2, "
        "x86_64, `--set x=0.625`, [jobs/results/a-1.19x.md](jobs/results/a-1.19x.md).\n"
        "```\nratio: 1.19x  # in a code block\n```\n<!-- 0.625 in a comment -->\n"
    )
    assert [f.text for b in blocks(text) for f in figures(b)] == []


def test_the_figure_forms() -> None:
    text = "0.94x greedy, 10x, 56%, 4.5 %, 0.625, 1.268 s, 655 tok/s, 31,778 documents/hour, 3.2 -> 1.06x.\n"
    assert [f.text for b in blocks(text) for f in figures(b)] == [
        "0.94x",
        "10x",
        "56%",
        "4.5 %",
        "0.625",
        "1.268",
        "655 tok/s",
        "31,778 documents/hour",
        "1.06x",
    ]


def test_a_table_row_cites_through_its_caption_and_the_measured_marker(tmp_path: Path) -> None:
    readme = _repo(
        tmp_path,
        (
            f"H100, 2026-11-24, commit 8f147ad ([table]({RESULT})): <!-- measured -->\n"
            "| batch | score | ratio |\n|---|---:|---:|\n| 8 | 0.625 | 1.19 |\n| 16 | 0.625 | 1.19 |\n"
        ),
        {RESULT: RESULT_TEXT},
    )
    found = problems(readme, tmp_path)
    assert found == ["README.md:5: 16 is in none of the files it cites (jobs/results/bench.md)"], (
        found
    )


def test_formatting_and_raw_values_are_the_only_tolerance(tmp_path: Path) -> None:
    path = tmp_path / "r.md"
    path.write_text("gap 0.556517, ratio 1.0575, 83.3%, $0.925, 14.0%\n", encoding="utf-8")
    text = "56% 0.557 1.06x 83.3% 14% | 83% 0.93x 1.05x 0.556 84%\n"
    figs = {f.text: f for b in blocks(text) for f in figures(b)}
    assert len(figs) == 10, figs
    assert {t for t, f in figs.items() if holds(path, f)} == {
        "56%",
        "0.557",
        "1.06x",
        "83.3%",
        "14%",
    }
