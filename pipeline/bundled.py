"""The data that ships in the clone (jobs/corpus, the sample specs), found from any folder.

Commands default to paths such as ``jobs/corpus``, relative to the clone: a user who runs
them from their own project folder has no such folder there. ``bundled(path)`` is ``path``
when it exists from here (the user's own folder of that name wins), else the clone's own.
"""

from __future__ import annotations

from pathlib import Path

#: The clone longdoc runs from (pipeline/ is one of its top-level folders).
ROOT = Path(__file__).resolve().parents[1]


def bundled(path: str) -> str:
    """``path`` if it exists from the current folder, else the same path inside the clone
    when that exists there, else ``path`` unchanged (its reader then says it is missing)."""
    if Path(path).exists() or Path(path).is_absolute():
        return path
    inside = ROOT / path
    return str(inside) if inside.exists() else path
