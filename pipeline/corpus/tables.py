"""Parse reST grid and simple tables into rows of cell strings (for ``pipeline.corpus.rst``).

``read_table(lines, i)`` returns ``(rows, end)`` when a table starts at ``lines[i]``:
``rows`` is a list of rows, each a list of raw cell texts (multi-line cells joined
with spaces, inline markup untouched), and ``end`` the index of the first line after
the table. It returns None when ``lines[i]`` does not start a table.
"""

from __future__ import annotations

import re

_SIMPLE_BORDER = re.compile(r"^\s*=+( +=+)+\s*$")


def _grid_rows(lines: list[str]) -> list[list[str]]:
    """``+---+---+`` tables: the ``+`` columns of the top border cut every line into cells."""
    border = lines[0].strip()
    cuts = [i for i, ch in enumerate(border) if ch == "+"]
    rows: list[list[str]] = []
    cells: list[list[str]] = [[] for _ in cuts[1:]]
    for line in lines[1:]:
        line = line.strip()
        if line.startswith("+"):  # row separator (also the ``+===+`` header rule)
            if any(cells):
                rows.append([" ".join(c) for c in cells])
            cells = [[] for _ in cuts[1:]]
            continue
        for k, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
            part = line[a + 1 : b].strip()
            if part:
                cells[k].append(part)
    return rows


def _simple_rows(lines: list[str]) -> list[list[str]]:
    """``=====  =====`` tables: the ``=`` runs of the top border give the columns."""
    spans = [m.span() for m in re.finditer(r"=+", lines[0].rstrip())]
    rows: list[list[str]] = []
    for line in lines[1:]:
        if _SIMPLE_BORDER.match(line) or not line.strip() or set(line.strip()) <= {"-", " "}:
            continue
        # The last column runs to the end of the line.
        cells = [line[a : (b if k + 1 < len(spans) else None)].strip()
                 for k, (a, b) in enumerate(spans)]
        if rows and not cells[0]:  # an empty first cell continues the previous row
            rows[-1] = [f"{p} {c}".strip() for p, c in zip(rows[-1], cells, strict=False)]
        else:
            rows.append(cells)
    return rows


def read_table(lines: list[str], i: int) -> tuple[list[list[str]], int] | None:
    """``(rows, end)`` for a grid or simple table starting at ``lines[i]``, else None."""
    first = lines[i].strip()
    end = i + 1
    if first.startswith("+-"):
        while end < len(lines) and lines[end].strip()[:1] in ("+", "|"):
            end += 1
        return _grid_rows(lines[i:end]), end
    if _SIMPLE_BORDER.match(lines[i]):
        # Simple tables may hold blank lines; they end at a border followed by a blank line.
        while end < len(lines):
            end += 1
            if _SIMPLE_BORDER.match(lines[end - 1]) and (
                    end >= len(lines) or not lines[end].strip()):
                break
        return _simple_rows(lines[i:end]), end
    return None
