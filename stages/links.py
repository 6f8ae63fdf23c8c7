"""Symbolic links planted in a local output tree: refused before a run writes a date.

Why: on a shared machine or a shared (NFS) output folder, whoever can write in the output's
folders could plant a link there, and a run would follow it: publish (rename) its rows into
a folder outside the output (a linked ``run_date=D``), delete files elsewhere (a linked
``_staging`` or ``_ledger``: published staged blocks and a date's ledger are removed), take
another output's rows as the date's (a linked Parquet file: the run skips their requests and
the table holds foreign rows), or write its records and marks elsewhere. The security review
that made the date's lease refuse links (pipeline/date_lease.py ``LinkedLease``) found the
lease only; this module covers the rest of a date's tree.

Contract:
- ``planted_links(root, run_date)`` returns ``[(link, target)]``: every symbolic link at a
  path the run of ``run_date`` reads, writes, renames or deletes below the output root and
  its sibling ``{root}.runs`` (stages/layout.py), newest layout and the one of earlier
  versions; and every link among the entries of ``{root}/run_date=D/`` and of
  ``{root}.runs/_staging/D/`` (a run's own staging folder could be planted ahead of it).
  Local paths only: an object store has no links, and is asked nothing (no listing).
- ``skipped_links(root)`` returns the links a scan of the whole output skips (date
  folders that are links, links inside the others), for `longdoc report` to name.
- ``refuse_links(root, run_date)`` raises ``LinkedOutput`` naming the first link, where it
  points and the fix; callers run it before anything is written or any model loads
  (pipeline/date_lease.py ``DateLease.acquire``, pipeline/preflight.py).
- The output root itself (and any folder above it) may be a link: a user may link the
  output folder to a bigger disk. Only what lies below it is checked; ``{root}.runs`` is
  refused too (the lease's rule: it holds the leases).
- Left to the lease's holder, not to this check: a link planted while a run holds its date
  (between this check and a write) is followed; readers (stages/partition.py ``list_files``)
  skip links they meet, so a scan never counts a linked file's rows.
"""

from __future__ import annotations

import os

from stages.layout import LEGACY_RUNS, runs_root


class LinkedOutput(ValueError):
    """A symbolic link inside an output tree: refused, never followed (module docstring).
    A bad setup, like a bad spec: ``run`` exits 2."""

    def __init__(self, link: str, target: str, root: str) -> None:
        self.link, self.target = link, target
        super().__init__(
            f"{link} is a symbolic link (to {target}): longdoc does not follow links inside an output's "
            f"folders (a run would read, publish or delete files outside {root}); fix: remove the link "
            f"(rm '{link}') and check who else can write to the output's folders. To keep an output on "
            "another disk, point output.uri at the real folder there")


def local_path(root: str) -> str | None:
    """``root`` as a local path, or None for an object store (no links there)."""
    if root.startswith("file://"):
        root = root.removeprefix("file://")
    elif "://" in root:
        return None
    return os.path.expanduser(root)  # "~/out" is the home's out folder, as fsspec writes it


def _fixed_paths(root: str, run_date: str) -> list[str]:
    """Every path of ``run_date`` below ``root`` and ``{root}.runs`` that a run uses by name,
    parents before children (stages/layout.py, stages/ledger.py, stages/completion.py)."""
    runs = runs_root(root)
    return [
        runs,
        f"{runs}/{run_date}",  # run records
        f"{runs}/_staging", f"{runs}/_staging/{run_date}",
        f"{runs}/_ledger", f"{runs}/_ledger/{run_date}",
        f"{runs}/_complete", f"{runs}/_complete/{run_date}.parquet",
        f"{runs}/_scratch",
        f"{runs}/_leases",
        f"{root}/run_date={run_date}",
        # an earlier version's folders inside the root, still read (and its staging published)
        f"{root}/{LEGACY_RUNS}", f"{root}/{LEGACY_RUNS}/{run_date}",
        f"{root}/_staging", f"{root}/_staging/{run_date}",
        f"{root}/_ledger", f"{root}/_ledger/{run_date}",
    ]


def _entries(folder: str) -> list[str]:
    """The entries of ``folder`` that are links (none when it is missing or not a folder)."""
    try:
        with os.scandir(folder) as it:
            return [e.path for e in it if e.is_symlink()]
    except OSError:  # missing, not a folder, or unreadable: the run's own listing says so
        return []


def planted_links(root: str, run_date: str) -> list[tuple[str, str]]:
    """(link, where it points) for every link a run of ``run_date`` would meet below ``root``
    (module docstring); [] for an object store. One ``lstat`` per fixed path, one listing of
    the date's partition and staging folders (which the run lists anyway)."""
    local = local_path(root)
    if local is None:
        return []
    local = local.rstrip("/") or "/"
    found = [p for p in _fixed_paths(local, run_date) if os.path.islink(p)]
    for folder in (f"{local}/run_date={run_date}", f"{runs_root(local)}/_staging/{run_date}"):
        # Not through a link found above (its entries are the link's target's): every other
        # link is named at once, so one round of fixes is enough.
        if not any(folder == p or folder.startswith(p + "/") for p in found):
            found += _entries(folder)
    return [(p, os.readlink(p)) for p in found]


def skipped_links(root: str) -> list[tuple[str, str]]:
    """(link, where it points) for the links a scan of the whole output skips: date folders
    (``{root}/run_date=*``) that are links, and links among the entries of the others. [] for
    an object store. What `longdoc report` says it left out (an archive linked back as a
    date would otherwise vanish from it without a word)."""
    local = local_path(root)
    if local is None or not os.path.isdir(local):
        return []
    found = []
    with os.scandir(local) as it:
        dates = sorted(e.path for e in it if e.name.startswith("run_date="))
    for folder in dates:
        found += [folder] if os.path.islink(folder) else _entries(folder)
    return [(p, os.readlink(p)) for p in found]


def refuse_links(root: str, run_date: str) -> None:
    """Raise ``LinkedOutput`` naming the first link ``planted_links`` finds."""
    links = planted_links(root, run_date)
    if links:
        raise LinkedOutput(*links[0], root)
