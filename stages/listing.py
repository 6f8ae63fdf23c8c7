"""Which files an input names: the listing every reader of the input shares.

Contract:
- ``list_shards(input_spec, run_date)`` (driver side, cheap) returns the files to
  read, sorted, or raises ValueError naming the URI when nothing is there or when a
  local entry is not a regular file (a FIFO would block the reader for ever, a link to
  /dev/zero never end). Under a folder, names starting with ``.`` or ``_`` are left out
  (``hidden``). The runner calls it ONCE per run and hands the list on: the
  plan, the progress line and the abort path use that list, and nothing reads the
  input but the read stage (stages/ledger.py records what it read).
- ``list_input(input_spec, run_date)``: the same listing (``Listing.shards``) and its
  ``digest``: a hash of every listed file's path, size and change stamps (``change_stamp``:
  mtime/inode locally, ETag/generation/last-modified on object stores), from the entries the
  walk already has (no request per file); None when the store gives a file no change stamp.
  Equal digests: the same files with, as far as the store can tell, the same bytes
  (pipeline/runner.py recognises a complete date by it, stages/completion.py).
- ``resolve_uri(uri, run_date, job)``: the URI with ``{run_date}`` and ``{job}`` filled.
- ``skipped_suffixes(input_spec, run_date)``: the files under a folder input its format does
  not read, counted by suffix, for `validate`'s note.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

import fsspec

from schemas.spec import FORMAT_SUFFIXES, InputSpec


def resolve_uri(uri: str, run_date: str, job: str = "") -> str:
    return uri.replace("{run_date}", run_date).replace("{job}", job)


def _missing_where(fs, uri: str, root: str) -> str:
    """For an object store: whether the bucket itself is missing or only the prefix under it
    (a wrong bucket and a date with no data read alike)."""
    if "://" not in uri or uri.startswith("file://") or "/" not in root.strip("/"):
        return ""
    bucket = root.strip("/").split("/", 1)[0]
    try:
        there = fs.exists(bucket)
    except Exception:  # noqa: BLE001 - the store will not say: the message stays as it is
        return ""
    if not there:
        return f": the bucket {bucket!r} does not exist; fix: the bucket's name, or the endpoint (AWS_ENDPOINT_URL)"
    return (f": the bucket {bucket!r} exists, nothing is under this prefix; fix: the prefix (or a run "
            "date whose data has arrived)")


#: Listing-entry fields that change when a file's bytes do, per store: fsspec's local files
#: (``mtime``, ``ino``: a rewrite by rename; ``created`` is the ctime), s3fs (``ETag``,
#: ``LastModified``), gcsfs (``md5Hash``, ``generation``, ``updated``), adlfs (``etag``,
#: ``last_modified``), memory (``created``). Every one present goes into the stamp, when one
#: of ``STRONG_FIELDS`` is.
CHANGE_FIELDS = ("mtime", "ino", "created", "ETag", "etag", "md5Hash", "generation", "LastModified",
                 "last_modified", "updated")
_DIGEST_MOD = 2**256


@dataclass(frozen=True)
class Listing:
    """The files an input names (``shards``, sorted URIs) and ``digest``, a hash of their
    paths, sizes and change stamps (None when some file has no change stamp)."""

    shards: list[str]
    digest: str | None


#: Of ``CHANGE_FIELDS``, those that change with every rewrite: a content hash or a version,
#: or the inode (a rewrite by rename). Times alone are too coarse to tell (sftp and ftp give
#: whole seconds; on macOS ``created`` is the birth time, kept by ``cp -p``).
STRONG_FIELDS = ("ino", "ETag", "etag", "md5Hash", "generation")


def change_stamp(info: dict) -> str | None:
    """What of a listing entry changes when the file's bytes do (``CHANGE_FIELDS``, with the
    size), as text; None when the store gives none of ``STRONG_FIELDS`` (an HTTP or sftp
    listing: its files cannot be told unchanged, so no digest, and a rerun reads them)."""
    if not any(info.get(k) is not None for k in STRONG_FIELDS):
        return None
    found = [f"{k}={info[k]}" for k in CHANGE_FIELDS if info.get(k) is not None]
    return f"size={info.get('size')};" + ";".join(found)


class _Digest:
    """An order-free hash of (path, stamp) entries: the sum of their sha256 values mod 2**256,
    and their count. Order-free because a walk's order is the store's; folded as the walk goes,
    so it holds nothing per file (the listing's memory stays the path list)."""

    def __init__(self) -> None:
        self.total, self.count, self.unstamped = 0, 0, False

    def add(self, path: str, info: dict) -> None:
        stamp = change_stamp(info)
        if stamp is None:
            self.unstamped = True
            return
        h = hashlib.sha256(f"{path}\0{stamp}".encode("utf-8", "surrogatepass")).digest()
        self.total = (self.total + int.from_bytes(h, "big")) % _DIGEST_MOD
        self.count += 1

    def hexdigest(self) -> str | None:
        return None if self.unstamped else f"{self.count}-{self.total:064x}"


def list_shards(inp: InputSpec, run_date: str) -> list[str]:
    """Files to read, as full URIs (protocol kept), sorted: ``list_input``'s ``shards``."""
    return list_input(inp, run_date).shards


def list_input(inp: InputSpec, run_date: str) -> Listing:
    """Files to read, as full URIs (protocol kept), sorted for a stable order, and the
    listing's digest (``Listing``).

    The listing walks the tree one folder at a time and keeps only the matching paths: a
    listing's metadata (size, times, type per entry) lives for one folder, not the corpus.
    ``fs.find(detail=True)`` held it for every file at once (100k files: a 76 MB peak for
    an 8 MB path list).
    """
    uri = resolve_uri(inp.uri, run_date)
    fs, root = fsspec.core.url_to_fs(uri)
    # s3fs and gcsfs keep listings for the process's life: a process that runs dates again
    # (a test, a notebook) would see old ETags, and the digest would miss a rewritten file.
    # All of it: given a path they drop it and its parents, not the folders below it, which
    # the walk lists again anyway.
    fs.invalidate_cache()
    if not fs.exists(root):
        glob = " (patterns like * are not expanded: name the folder, and every file of the format below it is read)"
        raise ValueError(f"input.uri {uri!r} does not exist" + (glob if any(c in uri for c in "*?[") else "")
                         + _missing_where(fs, uri, root))
    digest = _Digest()
    if fs.isfile(root):
        info = fs.info(root)
        _check_regular(root, info)
        digest.add(root, info)
        return Listing([_unstrip(fs, root)], digest.hexdigest())
    suffixes = FORMAT_SUFFIXES[inp.format]
    paths = []
    others: dict[str, int] = {}  # what the folder holds instead, named when nothing matched
    for folder, dirs, files in fs.walk(root, detail=True):
        _drop_hidden(dirs)
        for name, info in files.items():
            path = f"{folder.rstrip('/')}/{name}" if name else folder
            if not hidden(name) and path.lower().endswith(suffixes):
                _check_regular(path, info)
                paths.append(path)
                digest.add(path, info)
            elif not hidden(name):
                suffix = file_suffix(name)
                others[suffix] = others.get(suffix, 0) + 1
    if not paths:
        raise ValueError(
            f"input.uri {uri!r} has no {inp.format} files (looked for {', '.join(suffixes)} "
            f"in the folder and below){_no_match_fix(inp.format, others)}"
        )
    paths.sort()
    return Listing([_unstrip(fs, p) for p in paths], digest.hexdigest())


def _no_match_fix(fmt: str, others: dict[str, int]) -> str:
    """What a folder without a file of format ``fmt`` holds instead (``others``: count by
    suffix) and the fix: the format that reads them when one does, else the data's folder."""
    if not others:
        return "; it holds no files (names starting with . or _ are left out); fix: point input.uri at the data"
    held = ", ".join(f"{n} {suffix or 'without a suffix'}" for suffix, n in sorted(others.items()))
    readers = sorted({f for f, sufs in FORMAT_SUFFIXES.items() for suffix in others if suffix in sufs})
    switch = f"set input.format: {' or '.join(readers)} to read them, or " if readers else ""
    return f"; it holds {held}; fix: {switch}point input.uri at the folder of the {fmt} files"


def skipped_suffixes(inp: InputSpec, run_date: str) -> dict[str, int]:
    """Files under a folder input that its format does not read, counted by suffix (``.pdf``:
    2; no suffix: ``""``), hidden ones (``hidden``) left out: what `validate` names so that a folder of
    mixed files does not lose some without a word. {} for a single file or a missing folder."""
    fs, root = fsspec.core.url_to_fs(resolve_uri(inp.uri, run_date))
    if not fs.isdir(root):
        return {}
    suffixes = FORMAT_SUFFIXES[inp.format]
    out: dict[str, int] = {}
    for _folder, dirs, files in fs.walk(root):
        _drop_hidden(dirs)
        for name in files:
            if hidden(name) or name.lower().endswith(suffixes):
                continue
            suffix = file_suffix(name)
            out[suffix] = out.get(suffix, 0) + 1
    return out


def file_suffix(name: str) -> str:
    """A file name's suffix as the formats read it: the longest of ``FORMAT_SUFFIXES`` it ends
    with (``.jsonl.gz``, which a jsonl input reads), else its last one (``.pdf``; "" when none)."""
    lower = name.lower()
    known = [s for sufs in FORMAT_SUFFIXES.values() for s in sufs if lower.endswith(s)]
    return max(known, key=len) if known else os.path.splitext(lower)[1]


def hidden(name: str) -> bool:
    """A name a folder listing leaves out, as Spark, Hive and Hadoop do: ``.`` files (editors'
    and tools' own) and ``_`` ones (``_SUCCESS``, ``_temporary/`` of a write in progress)."""
    return name.startswith((".", "_"))


def _drop_hidden(dirs: dict | list) -> None:
    """Prune hidden folders from an ``fs.walk`` step (top-down: it descends into what is left)."""
    for name in [d for d in dirs if hidden(d)]:
        if isinstance(dirs, dict):
            del dirs[name]
        else:
            dirs.remove(name)


def _check_regular(path: str, info: dict) -> None:
    # fsspec's local filesystem types FIFOs, devices and sockets "other" (links followed).
    if info.get("type", "file") not in ("file", "directory"):
        raise ValueError(
            f"input.uri: {path!r} is not a regular file ({special_kind(path)}); allowed: regular "
            "files (a FIFO blocks the reader, a device never ends)"
        )


def special_kind(path: str) -> str:
    """What a local non-regular file is, in words ("a FIFO", "a character device", ...)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "unreadable"
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def _unstrip(fs: fsspec.AbstractFileSystem, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"
