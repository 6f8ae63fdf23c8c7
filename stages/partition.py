"""One run date's files: scan what is there, and commit staged blocks (with compaction).

Files of a run date (see stages/write.py for the names):
- committed: ``{root}/run_date=D/*.parquet``, what readers see. Invariant: each
  request is in exactly one committed file, once.
- staged: ``{root}.runs/_staging/D/{run_id}/*.staged``, written block by block during a
  run; outside the output root, invisible to readers. Blocks an earlier version staged
  in ``{root}/_staging/D/`` (a crashed run's) are published too (stages/layout.py
  ``staging_dirs``).

``commit_date`` publishes the staged rows with two kinds of single-file atomic steps,
so a reader listing the folder at ANY moment (or a crash at any point) sees every
committed request exactly once:
1. a staged row whose request is already committed (a retried error row) replaces it
   IN the committed file: the file is rewritten whole under the same name (a temporary
   file in ``{root}.runs/_scratch`` + rename locally, so the folder never holds an
   unfinished file; one PUT on object stores, which replaces atomically);
2. the other staged rows are new requests: they are compacted into one file per
   ``target_bytes`` (not one per block) named ``part-{run_id}-{digest}.parquet``;
3. only then are the staged files deleted.
Each request is published once even when a block holds it twice (an input row repeated
exactly: same id, text and question give the same request_id): the first row is kept.
A crash before 3 leaves staged files behind: the next run commits them first (so no
request is lost), and re-committing a row that is already committed is a no-op.
One run of a date at a time (two concurrent runs of one date are not supported).

``scan_date`` reads just ``request_id``/``error``/``error_kind`` of every file: the one
place that lists a run date (resume, retry selection, summary counts, report).

``upgrade_date`` gives a date's files of an older schema the current columns (new ones
null, values kept): readers take a folder's columns from one file (pandas and DuckDB drop
newer columns, Polars refuses the folder). A commit upgrades its date; `longdoc upgrade`
the others.

``superseded`` names the committed rows a complete run replaces, so a rerun after the spec
changed (another model, budget or instruction: other request ids) or after a malformed
input line was fixed does not leave the old rows beside the new ones. The runner hands them to ``commit_date`` as
``stale``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.output import FILE_SCHEMA, INPUT, RETRYABLE, is_retried
from stages.layout import scratch_dir, staging_dirs
from stages.write import (
    STAGED_SUFFIX,
    block_digest,
    is_local,
    partition_dir,
    put_file_atomic,
    write_table_atomic,
)

TARGET_FILE_BYTES = 256 * 2**20  # compacted file size (staged Parquet bytes) for analytics
# In-memory rows buffered per row group while compacting. The driver's memory at publish
# is mostly this buffer plus its allocator's slack: publishing 100k staged rows peaked ~90 MB
# higher with 64 MiB than with 8 MiB; 16 MiB still gives readers row groups of thousands
# of rows.
ROW_GROUP_BYTES = 16 * 2**20


@dataclass(slots=True)  # one per request of the date: no per-instance __dict__
class RowState:
    path: str  # file holding the row (committed, or staged when not yet committed)
    error: str | None
    error_kind: str | None


@dataclass
class DateScan:
    """Every request of one run date, as readers will see it once staged rows are committed."""

    fs: fsspec.AbstractFileSystem
    committed: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    rows: dict[str, RowState] = field(default_factory=dict)

    def skip(self, retry_errors: str) -> frozenset[str]:
        """Request ids a rerun must not redo under ``--retry-errors`` (all|retryable|none)."""
        return frozenset(
            rid for rid, s in self.rows.items() if s.error is None or not is_retried(s.error_kind, retry_errors)
        )

    def counts(self) -> dict[str, int]:
        """rows, failed, and failed rows per error kind (``errors_input``, ``errors_retryable``)."""
        failed = [s for s in self.rows.values() if s.error is not None]
        return {
            "rows": len(self.rows),
            "failed": len(failed),
            f"errors_{INPUT}": sum(s.error_kind == INPUT for s in failed),
            f"errors_{RETRYABLE}": sum(s.error_kind != INPUT for s in failed),
        }


def _visible(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith((".", "_"))


def list_files(fs: fsspec.AbstractFileSystem, folder: str, suffix: str) -> list[str]:
    """The visible files of ``folder`` (and below) whose names end in ``suffix``, sorted.

    Locally, links are skipped: ``folder`` itself when it is one, and every file link in it
    (fsspec's ``find`` follows both, and does not descend into a folder link below). A link
    planted in an output tree would otherwise make a scan count another folder's rows as the
    date's, or one date's rows under two dates (`longdoc report`). A run refuses such links
    before it writes (stages/links.py); readers skip them. Object stores have no links: no
    extra call is made there."""
    if not fs.exists(folder):
        return []
    local = is_local(fs)
    if local and os.path.islink(folder.rstrip("/")):
        return []
    return sorted(f for f in fs.find(folder)
                  if f.endswith(suffix) and _visible(f) and not (local and os.path.islink(f)))


def read_file(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None = None) -> pa.Table:
    """One output file conformed to FILE_SCHEMA (or its ``columns``).

    Files written before schema version 2 lack ``error_kind``/``schema_version`` and
    hold ``run_date`` inside: missing columns come back null (``schema_version`` 1),
    the in-file ``run_date`` is dropped (the folder is the truth).
    """
    want = columns or FILE_SCHEMA.names
    with fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        have = set(pf.schema_arrow.names)
        table = pf.read(columns=[c for c in want if c in have])
    n = table.num_rows
    cols = []
    for name in want:
        f = FILE_SCHEMA.field(name)
        if name in have:
            cols.append(table.column(name).cast(f.type))
        elif name == "schema_version":
            cols.append(pa.array([1] * n, f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=pa.schema([FILE_SCHEMA.field(c) for c in want]))


def is_outdated(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """Whether a committed file's columns are not FILE_SCHEMA's (written by an earlier
    version of the schema); reads the file's footer only."""
    with fs.open(path, "rb") as fh:
        return pq.read_schema(fh).names != FILE_SCHEMA.names


def upgrade_date(root: str, run_date: str, paths: list[str] | None = None) -> int:
    """Rewrite ``run_date``'s outdated committed files (``paths``, else every file checked)
    to FILE_SCHEMA, each atomically under its name; values unchanged (``schema_version``
    still says which version wrote each row). Returns the files rewritten. One writer of a
    date at a time, as for ``commit_date``."""
    fs, part = fsspec.core.url_to_fs(partition_dir(root, run_date))
    if paths is None:
        paths = [p for p in list_files(fs, part, ".parquet") if is_outdated(fs, p)]
    scratch = _scratch(fs, root)
    for path in paths:
        write_table_atomic(read_file(fs, path).cast(FILE_SCHEMA), _uri(fs, path), scratch)
    return len(paths)


def _states(fs, path: str) -> Iterator[tuple[str, RowState]]:
    t = read_file(fs, path, ["request_id", "error", "error_kind"])
    for rid, err, kind in zip(*(t.column(i).to_pylist() for i in range(3))):
        yield rid, RowState(path, err, kind)


def scan_date(root: str, run_date: str) -> DateScan:
    fs, part = fsspec.core.url_to_fs(partition_dir(root, run_date))
    scan = DateScan(fs, list_files(fs, part, ".parquet"), _staged_files(fs, root, run_date))
    for path in scan.committed:
        scan.rows.update(_states(fs, path))
    for rid, state in _staged_winners(fs, scan.staged).items():
        scan.rows[rid] = state
    return scan


@dataclass
class RunRequests:
    """What a complete run's input yields (from its ledger): ``ids``, the request ids;
    ``keys``, their (doc_id, prompt) pairs; ``files``, the input files it read whole
    (empty under ``input.limit``, which stops reading partway); ``covered``, under
    ``input.limit`` the files in input order up to the last one its requests came from
    (None: every input file), so that only their rows are replaced by a document's key (a
    document id also named in a later file, read ahead or not, keeps that file's row; one
    also named past the limit in that last file does not); ``shared``, document ids
    that name documents in more than one input file (``shared_examples``: the first few,
    each with two of its files). The read stage refuses an id that one file gives two
    texts (stages/read.py); across files, read apart, the run can only say so."""

    ids: set[str] = field(default_factory=set)
    keys: set[tuple[str, str | None]] = field(default_factory=set)
    files: frozenset[str] = frozenset()
    covered: frozenset[str] | None = None
    shared: int = 0
    shared_examples: dict[str, list[str]] = field(default_factory=dict)


def superseded(root: str, run_date: str, run: RunRequests) -> frozenset[str]:
    """Committed rows of ``run_date`` that are not requests of the complete run ``run`` and
    that it replaces: rows of the same document and prompt (the spec or the document's
    text changed since they were written: other request ids), and input-error rows of a
    file it read whole (a malformed line since fixed: its document now has a row of its
    own). Every other row stays: a document gone from the input, a file this run did not
    read (another night's folder, a file since deleted, one that failed to read now, one
    past ``input.limit``: ``run.covered``)."""
    fs, part = fsspec.core.url_to_fs(partition_dir(root, run_date))
    out: set[str] = set()
    for path in list_files(fs, part, ".parquet"):
        t = read_file(fs, path, ["request_id", "doc_id", "prompt", "source_uri", "error_kind"])
        for rid, doc_id, prompt, source, kind in zip(*(t.column(i).to_pylist() for i in range(5)), strict=True):
            same_key = (doc_id, prompt) in run.keys and (run.covered is None or source in run.covered)
            if rid not in run.ids and (same_key or (kind == INPUT and source in run.files)):
                out.add(rid)
    return frozenset(out)


def _staged_files(fs: fsspec.AbstractFileSystem, root: str, run_date: str) -> list[str]:
    """Every staged block of ``run_date``: this layout's, then an earlier version's."""
    return [f for d in staging_dirs(root, run_date)
            for f in list_files(fs, fsspec.core.url_to_fs(d)[1], STAGED_SUFFIX)]


def _staged_winners(fs, staged: list[str]) -> dict[str, RowState]:
    """request_id -> the staged row to publish. Normally each request is staged once;
    should a straggler task of a killed driver have staged one too, a success beats
    an error, then the later path wins (deterministic)."""
    winners: dict[str, RowState] = {}
    for path in staged:
        for rid, state in _states(fs, path):
            old = winners.get(rid)
            if old is None or state.error is None or old.error is not None:
                winners[rid] = state
    return winners


def _take(fs, path: str, ids: set[str]) -> pa.Table:
    """The rows of ``ids`` in one file, each request once (an input row repeated exactly
    is one request: a block may hold it twice, the table holds it once)."""
    t = read_file(fs, path)
    # A Python set lookup, not pc.is_in: is_in with a new value set per file grew the
    # driver by ~40 MB over the first ~500 files (Arrow's kernel state, never returned).
    t = t.filter(pa.array([rid in ids for rid in t.column("request_id").to_pylist()], pa.bool_()))
    return _first_per_request(t)


def _first_per_request(t: pa.Table) -> pa.Table:
    seen: set[str] = set()
    keep = [i for i, rid in enumerate(t.column("request_id").to_pylist()) if not (rid in seen or seen.add(rid))]
    return t if len(keep) == t.num_rows else t.take(keep)


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("request_id")


def commit_date(
    root: str,
    run_date: str,
    run_id: str,
    target_bytes: int = TARGET_FILE_BYTES,
    stale: frozenset[str] = frozenset(),
    check: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Publish every staged row of ``run_date`` (see the module docstring for the steps).

    ``check``: called before each file is written or removed; it raises when this process
    may no longer publish the date (pipeline/date_lease.py: another process took it over).
    The publish then stops between two single-file steps, as an interrupt does, and the
    next commit finishes it.

    ``stale``: committed error rows to drop because a complete rerun retried them and
    its input no longer yields their request (e.g. a file that failed to read as a
    whole reads now, so its documents got rows of their own). Dropped in step 1's
    single-file rewrite, so a reader never sees a request twice or a healed error.
    Returns counts: ``staged_files``, ``replaced`` (rows swapped into committed files),
    ``added`` (new rows), ``dropped`` (stale rows removed), ``files_written``,
    ``upgraded`` (files of an older schema given the current columns).
    """
    check = check or (lambda: None)
    fs, part = fsspec.core.url_to_fs(partition_dir(root, run_date))
    scratch = _scratch(fs, root)
    staged = _staged_files(fs, root, run_date)
    out = {"staged_files": len(staged), "replaced": 0, "added": 0, "dropped": 0, "files_written": 0, "upgraded": 0}
    if not staged and not stale:
        return out
    winners = _staged_winners(fs, staged)
    committed: dict[str, str] = {}
    files = list_files(fs, part, ".parquet")
    for path in files:
        committed.update((rid, path) for rid, _ in _states(fs, path))
    # 1. Retried requests: swap the new row into the committed file that holds the old
    #    one (or drop it when stale).
    by_file: dict[str, set[str]] = {}
    for rid in (winners.keys() | (stale - winners.keys())) & committed.keys():
        by_file.setdefault(committed[rid], set()).add(rid)
    for path, ids in sorted(by_file.items()):
        old = read_file(fs, path)
        mask = pc.is_in(old.column("request_id"), pa.array(sorted(ids), pa.string()))
        swapped = ids & winners.keys()
        new_rows = _staged_rows(fs, winners, swapped) if swapped else old.schema.empty_table()
        if _sorted(old.filter(mask)).equals(_sorted(new_rows)):
            continue  # committed by an earlier, interrupted commit
        table = pa.concat_tables([old.filter(pc.invert(mask)), new_rows])
        out["dropped"] += len(ids - swapped)
        check()
        if table.num_rows == 0:
            fs.rm_file(path)  # every row of the file was stale
            out["files_written"] += 1
            continue
        write_table_atomic(table.cast(FILE_SCHEMA), _uri(fs, path), scratch)
        out["replaced"] += len(swapped)
        out["files_written"] += 1
    # 2. New requests: compacted into few large files.
    new_ids = winners.keys() - committed.keys()
    for written in _compact(fs, part, run_id, winners, new_ids, target_bytes, scratch, check):
        out["added"] += written
        out["files_written"] += 1
    # The date's files an earlier version wrote get the current columns (module docstring).
    # (Files step 1 rewrote have them already; a file it emptied is gone.)
    outdated = [p for p in files if fs.exists(p) and is_outdated(fs, p)]
    if outdated:
        check()
    out["upgraded"] = upgrade_date(root, run_date, outdated)
    # 3. Everything is published: the staged copies can go.
    if staged:
        check()
    for path in staged:
        fs.rm_file(path)
    for d in sorted({p.rsplit("/", 1)[0] for p in staged}, reverse=True):
        _rmdir_quiet(fs, d)
    return out


def _staged_rows(fs, winners: dict[str, RowState], ids: set[str]) -> pa.Table:
    per_file: dict[str, set[str]] = {}
    for rid in ids:
        per_file.setdefault(winners[rid].path, set()).add(rid)
    return pa.concat_tables([_take(fs, p, s) for p, s in sorted(per_file.items())])


def _compact(fs, part: str, run_id: str, winners: dict[str, RowState], ids: set[str],
             target_bytes: int, scratch: str | None, check: Callable[[], None]) -> Iterator[int]:
    """Write the staged rows of ``ids`` into files of ~target_bytes; yield rows per file.

    Streamed: each staged file's rows go into the open compacted file's row-group buffer
    (ROW_GROUP_BYTES) as they are read, so the driver holds one row group, never a whole
    compacted file (~target_bytes) or the run's rows.
    """
    per_file: dict[str, set[str]] = {}
    for rid in ids:
        per_file.setdefault(winners[rid].path, set()).add(rid)
    out: _CompactFile | None = None
    for path, sel in sorted(per_file.items()):
        if out is None:
            out = _CompactFile()
        out.add(_take(fs, path, sel), sel)
        out.staged_bytes += fs.size(path)
        if out.staged_bytes >= target_bytes:
            check()
            yield out.publish(fs, part, run_id, scratch)
            out = None
    if out is not None:
        check()
        yield out.publish(fs, part, run_id, scratch)


class _CompactFile:
    """One compacted file being written to a local temporary file, row group by row group."""

    def __init__(self) -> None:
        self._tmpdir = tempfile.TemporaryDirectory(prefix="longdoc-compact-")
        self._local = os.path.join(self._tmpdir.name, "part.parquet")
        self._writer = pq.ParquetWriter(self._local, FILE_SCHEMA)
        self._group: list[pa.Table] = []
        self._group_bytes = 0  # a running total: re-summing the group per block was quadratic
        self.ids: list[str] = []  # the file's name hashes them (the same rows, the same name)
        self.staged_bytes = 0

    def add(self, table: pa.Table, ids: set[str]) -> None:
        """Buffer ``table``, whose rows are the requests ``ids`` (each once): the id strings
        the caller already holds are kept, not new copies read back from the table."""
        assert table.num_rows == len(ids), f"{table.num_rows} rows for {len(ids)} requests"
        self.ids.extend(ids)
        self._group.append(table)
        self._group_bytes += table.nbytes
        if self._group_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._group:  # one row group per ~ROW_GROUP_BYTES, not one per staged block
            self._writer.write_table(pa.concat_tables(self._group))
        self._group, self._group_bytes = [], 0

    def publish(self, fs, part: str, run_id: str, scratch: str | None) -> int:
        """Close the file and publish it atomically as ``part-{run_id}-{digest}.parquet``."""
        try:
            self._flush()
            self._writer.close()
            name = f"part-{run_id}-{block_digest(self.ids)}.parquet"
            put_file_atomic(self._local, _uri(fs, f"{part}/{name}"), scratch)
            return len(self.ids)
        finally:
            self._tmpdir.cleanup()


def _scratch(fs, root: str) -> str | None:
    """The local folder for a publish's temporary files (stages/layout.py ``scratch_dir``),
    as a plain path; None on object stores, whose single PUT needs none."""
    return scratch_dir(fsspec.core.strip_protocol(root)) if is_local(fs) else None


def _uri(fs, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)


def _rmdir_quiet(fs, path: str) -> None:
    try:
        if not fs.ls(path):
            fs.rmdir(path)
    except (OSError, NotImplementedError):
        pass  # object stores have no real folders
