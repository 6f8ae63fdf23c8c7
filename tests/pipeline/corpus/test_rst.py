"""The reST -> plain text converter used to build the sample corpus."""

from __future__ import annotations

import textwrap

import pytest

from pipeline.corpus.rst import collect_labels, inline, rst_to_text


def _rst(src: str, labels: dict[str, str] | None = None) -> str:
    return rst_to_text(textwrap.dedent(src), labels)


@pytest.mark.parametrize(
    ("markup", "plain"),
    [
        (":func:`sorted` and :meth:`~list.sort`", "sorted() and sort()"),
        (":class:`collections.OrderedDict`", "collections.OrderedDict"),
        (":pep:`8`, :rfc:`2616` and :issue:`5237`", "PEP 8, RFC 2616 and bpo-5237"),
        (":ref:`the tutorial <tut-intro>`", "the tutorial"),
        ("``*args`` and ``**kwargs``", "*args and **kwargs"),
        ("*level* or **severity**", "level or severity"),
        ("see `the site <https://python.org>`_ or Python_", "see the site or Python"),
        ("a footnote [#]_ here", "a footnote here"),
        ("``__init__`` keeps its underscores", "__init__ keeps its underscores"),
        (":abbr:`LIFO (last-in, first-out)`", "LIFO (last-in, first-out)"),
    ],
)
def test_inline(markup, plain):
    assert inline(markup) == plain


def test_ref_resolves_through_labels():
    labels = collect_labels([".. _tut-intro:\n\nAn Informal Introduction\n========================\n"])
    assert labels == {"tut-intro": "An Informal Introduction"}
    assert inline("see :ref:`tut-intro`", labels) == "see An Informal Introduction"


def test_headings_paragraphs_and_dropped_bookkeeping():
    out = _rst("""
        .. _label:

        ========
        Title
        ========

        .. index:: single: spam

        First paragraph with :func:`len`.

        Section
        -------

        .. note::
           Mind the gap.
    """)
    assert out == "Title\n\nFirst paragraph with len().\n\nSection\n\nNote: Mind the gap.\n"


def test_code_blocks_stay_verbatim_and_indented():
    out = _rst("""
        Example::

            x = ``not markup``

        .. code-block:: python
           :linenos:

           print(*args)

        Done.
    """)
    assert out == ("Example:\n\n    x = ``not markup``\n\n    print(*args)\n\nDone.\n")


def test_literal_block_inside_list_item_ends_at_item_text():
    out = _rst("""
        * Fields can be numbered::

            >>> '{}'.format(1)

          Formerly they could not.
    """)
    assert out == "* Fields can be numbered:\n\n      >>> '{}'.format(1)\n\n  Formerly they could not.\n"


def test_version_directives_and_descriptions():
    out = _rst("""
        .. function:: dump(obj, fp, *, \\
                           indent=None)

           Serialize *obj*.

           .. versionchanged:: 3.6
              All optional parameters are now keyword-only.

        .. versionadded:: 3.2
    """)
    assert out == (
        "dump(obj, fp, *, indent=None)\n\n    Serialize obj.\n\n"
        "    Changed in version 3.6: All optional parameters are now keyword-only.\n\n"
        "New in version 3.2.\n"
    )


def test_tables_become_rows():
    grid = _rst("""
        +-------+------------------+
        | Level | Use              |
        +=======+==================+
        | DEBUG | Detailed         |
        |       | information.     |
        +-------+------------------+
    """)
    assert grid == "Level | Use\nDEBUG | Detailed information.\n"
    simple = _rst("""
        =====  ==========
        Mode   Meaning
        =====  ==========
        ``r``  read
        ``w``  write
        =====  ==========

        After.
    """)
    assert simple == "Mode | Meaning\nr | read\nw | write\n\nAfter.\n"
