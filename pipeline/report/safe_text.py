"""Text from documents and models, made safe to print on a terminal.

Why: `report --answers` printed a row's document id, prompt, answer and reference as they
were, so a customer document (or a model's answer) could set the terminal's title, plant
a hyperlink, clear the screen or forge a report line with an escape sequence or a newline
in its id (a security review). ``printable`` writes every control character (C0, DEL, C1)
and the bidirectional overrides (which reorder what a reader sees) as its escape, e.g.
``\\x1b``; letters, marks and the joiners of any script stay as they are.
"""

from __future__ import annotations

import unicodedata

#: Bidirectional embeddings, overrides and isolates: invisible, and they reorder the line.
_BIDI = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


def _shown(ch: str) -> str:
    if unicodedata.category(ch) == "Cc" or ch in _BIDI:
        return ch.encode("unicode_escape").decode("ascii")
    return ch


def printable(text: str) -> str:
    """``text`` with its control characters and bidi overrides written as escapes."""
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(_shown(ch) for ch in text)
