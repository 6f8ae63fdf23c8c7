"""Where an output root's files live: the rows in it, everything else beside it.

Contract: an output root ``{root}`` holds only ``{root}/run_date=D/*.parquet``, so a
plain folder read (Polars, pandas, DuckDB, Spark) sees the table without options. What
else the job writes lives in the sibling ``{root}.runs/`` (``runs_root``: the one place
that says where):
- run records ``{root}.runs/D/{run_id}.json`` (``run_record_path``);
- staged blocks ``{root}.runs/_staging/D/{run_id}/`` (``staging_dir``);
- the request ledger ``{root}.runs/_ledger/D/{run_id}/`` (stages/ledger.py);
- the temporary files of a local publish into ``run_date=D/`` (``scratch_dir``);
- the lease naming the run that writes a date ``{root}.runs/_leases/D.json`` (``lease_path``);
- the mark of a complete date ``{root}.runs/_complete/D.parquet`` (``completion_path``).
Outputs written before this layout kept these in ``{root}/_runs/``, ``{root}/_staging/``
and ``{root}/_ledger/``: readers still look there (``run_record_candidates``,
``staging_dirs``, stages/ledger.py ``clear``); new runs never write there.
Pure string functions, no imports: the CLI's preflight uses them before anything heavy.
"""

from __future__ import annotations

RUNS_SUFFIX = ".runs"
LEGACY_RUNS = "_runs"  # run records of outputs written before ``runs_root``


def runs_root(root: str) -> str:
    """Where the run records (and every other non-row file) of output root ``root`` live:
    its sibling ``{root}.runs``. Outside ``root``, so a reader of the folder sees only
    ``run_date=D/*.parquet``. ``root`` must have a parent folder (schemas/spec.py refuses
    a bucket or filesystem root as ``output.uri``)."""
    return f"{root.rstrip('/')}{RUNS_SUFFIX}"


def run_record_dir(root: str, run_date: str) -> str:
    """Where the runs of ``run_date`` write their records: ``{root}.runs/{run_date}``."""
    return f"{runs_root(root)}/{run_date}"


def run_record_path(root: str, run_date: str, run_id: str) -> str:
    """The run record a run of ``root`` writes: ``{root}.runs/{run_date}/{run_id}.json``."""
    return f"{run_record_dir(root, run_date)}/{run_id}.json"


def run_record_dirs(root: str, run_date: str) -> list[str]:
    """Folders that may hold run records of ``run_date``, newest layout first: the current
    one, then ``{root}/_runs/{run_date}`` (outputs written by earlier versions)."""
    return [run_record_dir(root, run_date), f"{root.rstrip('/')}/{LEGACY_RUNS}/{run_date}"]


def run_record_candidates(root: str, run_date: str, run_id: str) -> list[str]:
    """Where a reader looks for the record of ``run_id``, in order (``run_record_dirs``)."""
    return [f"{d}/{run_id}.json" for d in run_record_dirs(root, run_date)]


def staging_dir(root: str, run_date: str) -> str:
    """Where blocks wait for the end-of-run commit: ``{root}.runs/_staging/{run_date}``."""
    return f"{runs_root(root)}/_staging/{run_date}"


def scratch_dir(root: str) -> str:
    """Where a local publish into ``{root}/run_date=D/`` builds each file before renaming
    it in: ``{root}.runs/_scratch`` (stages/write.py), so the partition never holds a
    file that is not finished Parquet, even for the instant of a write."""
    return f"{runs_root(root)}/_scratch"


def lease_path(root: str, run_date: str) -> str:
    """The lease of ``run_date``: ``{root}.runs/_leases/{run_date}.json``, naming the one run
    that writes the date now (pipeline/date_lease.py)."""
    return f"{runs_root(root)}/_leases/{run_date}.json"


def staging_dirs(root: str, run_date: str) -> list[str]:
    """Folders whose staged blocks a publish takes: ``staging_dir``, then the one of outputs
    written by earlier versions (``{root}/_staging/{run_date}``: a crashed run's rows)."""
    return [staging_dir(root, run_date), f"{root.rstrip('/')}/_staging/{run_date}"]


def completion_path(root: str, run_date: str) -> str:
    """The completion mark of ``run_date``: ``{root}.runs/_complete/{run_date}.parquet``, what
    the last complete run's input yielded (stages/completion.py)."""
    return f"{runs_root(root)}/_complete/{run_date}.parquet"
