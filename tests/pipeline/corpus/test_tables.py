"""pipeline/corpus/tables.py: reST grid and simple tables read into rows of cell texts
(multi-line cells joined, inline markup kept) and the index where the table ends."""

from __future__ import annotations

from pipeline.corpus.tables import read_table

GRID = """\
Intro paragraph.

+------------+-----------------+
| Option     | Meaning         |
+============+=================+
| ``-v``     | verbose output, |
|            | repeated for    |
|            | more            |
+------------+-----------------+
| ``-q``     | quiet           |
+------------+-----------------+

After the table.""".splitlines()

SIMPLE = """\
=====  ==========
Name   Effect
=====  ==========
alpha  first line
       goes on

beta   *second*
=====  ==========

Next paragraph.""".splitlines()


def test_grid_table_rows_multi_line_cells_and_end():
    rows, end = read_table(GRID, 2)
    assert rows == [["Option", "Meaning"], ["``-v``", "verbose output, repeated for more"], ["``-q``", "quiet"]]
    assert GRID[end] == "" and GRID[end + 1] == "After the table."


def test_simple_table_continuation_rows_blank_lines_and_end():
    rows, end = read_table(SIMPLE, 0)
    assert rows == [["Name", "Effect"], ["alpha", "first line goes on"], ["beta", "*second*"]]
    assert end == 8 and SIMPLE[end] == ""


def test_a_line_that_starts_no_table_gives_none():
    assert read_table(GRID, 0) is None
    assert read_table(["| a | b |"], 0) is None
    assert read_table(["=====", "one column is a section rule, not a table"], 0) is None
