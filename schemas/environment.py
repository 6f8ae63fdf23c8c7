"""What only the machine that runs a job can know about its spec: filesystem packages
installed, local paths present, an output that is not the input.

Why a module of its own: schemas/loading.py turns a YAML file and ``--set`` overrides into a
valid JobSpec, the same on every machine; these checks ask this machine's filesystem and
installed packages, and run again wherever the job runs (``validate``, ``run``, ``submit``,
the bench).

Contract: ``check_environment(spec, run_date, local_paths, spec_dir)`` returns the problems
as ``field: message`` lines (empty: none), never raises for a missing path; ``looks_local``
and ``named_models`` say which of a spec's model fields name local paths
(pipeline/model_checks.py checks those folders' contents).
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

from schemas.checks import shown
from schemas.loading import _file_kind
from schemas.spec import JobSpec

#: Scheme -> (module that implements it, the longdoc extra that installs it).
_SCHEME_PACKAGES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
_LOCAL_PREFIXES = ("/", "./", "../", "~")


def _module_available(name: str) -> bool:
    # sys.modules[name] = None is Python's own "this import is blocked" marker.
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def _scheme(uri: str) -> str | None:
    return uri.split("://", 1)[0] if "://" in uri else None


def looks_local(value: str) -> bool:
    """Whether a model or URI value names a local path (not a hub id or a remote URI)."""
    return value.startswith(_LOCAL_PREFIXES) or value.startswith("file://")


#: Keys of a compression method's settings that name something the run loads: the
#: AutoCompressor's checkpoint, rag's embedder, select's scorer.
MODEL_KEYS = ("checkpoint", "embedder", "scorer")


def named_models(spec: JobSpec) -> list[tuple[str, str, str]]:
    """(field, value, key) of every model ``spec`` loads: ``generation.model`` (key ``model``)
    and the method's ``MODEL_KEYS`` that are set."""
    named = [("generation.model", spec.generation.model, "model")]
    named += [(f"compression.{k}", v, k) for k, v in spec.compression if k in MODEL_KEYS and isinstance(v, str)]
    return named


def check_environment(spec: JobSpec, run_date: str | None = None, local_paths: bool = True,
                      spec_dir: Path | None = None) -> list[str]:
    """Problems that make ``spec`` fail on THIS machine, as ``field: message`` lines.

    - an ``s3://``/``gs://`` URI whose filesystem package (s3fs/gcsfs) is not installed;
    - with ``local_paths``: a local model/checkpoint/embedder/scorer path that does not exist,
      and a local input.uri that does not exist (checked only when it has no
      ``{run_date}`` or ``run_date`` is given; a relative one found beside the spec, in
      ``spec_dir``, is named there with the fix). Hub ids are the preflight's
      (pipeline/preflight.py), which may ask the network.
    """
    problems = []
    for field, uri in (("input.uri", spec.input.uri), ("output.uri", spec.output.uri)):
        scheme = _scheme(uri)
        if scheme in _SCHEME_PACKAGES:
            module, extra = _SCHEME_PACKAGES[scheme]
            if not _module_available(module):
                problems.append(
                    f"{field}: {shown(uri)} needs the {module} package, which is not installed; "
                    f"install longdoc[{extra}] (pip install 'longdoc[{extra}]')"
                )
    if not local_paths:
        return problems
    uri = spec.input.uri
    if "{run_date}" in uri and run_date is not None:
        uri = uri.replace("{run_date}", run_date)
    if _scheme(uri) in (None, "file") and "{" not in uri:
        path = Path(uri.removeprefix("file://")).expanduser()
        try:
            st = path.stat()  # follows symlinks: a .jsonl link to /dev/zero is a device
        except OSError:
            st = None
        if st is None:
            # A relative path is the commonest miss: say where it was looked for.
            looked = "" if path.is_absolute() else f" (looked for {shown(str(path.absolute()))})"
            glob = " (patterns like * are not expanded)" if any(c in uri for c in "*?[") else ""
            # Paths resolve from the current folder, not the spec's: a spec run from elsewhere
            # misses the input lying beside it, and the fix is to say where it is.
            beside = (spec_dir / path).absolute() if spec_dir is not None and not path.is_absolute() else None
            if beside is not None and beside.exists() and beside != path.absolute():
                problems.append(f"input.uri: {shown(uri)} does not exist{looked}, but the spec's folder has it "
                                f"({shown(str(beside))}); fix: run longdoc from {shown(str(spec_dir.absolute()))} "
                                "(a spec's relative paths resolve from the folder you run longdoc in), or "
                                "give the absolute path")
            else:
                # Not for a pattern (it was never a name) nor a dated uri (another date's file is
                # no fix: the spec would pin that date).
                near = None if glob or "{run_date}" in spec.input.uri else _near_name(path)
                hint = f" (did you mean {shown(near)}?)" if near else ""
                problems.append(f"input.uri: {shown(uri)} does not exist{looked}{glob}{hint}; allowed: an existing "
                                "file or folder (every file of the format below a folder is read), a relative "
                                "path from the folder you run longdoc in")
        elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            # A FIFO blocks the reader for ever and /dev/zero never ends: refused, not read.
            problems.append(
                f"input.uri: {shown(uri)} is {_file_kind(st.st_mode)}; allowed: a regular file or a folder"
            )
        else:
            problems += _output_aliases_input(spec, path, run_date)
    for field, value, _ in named_models(spec):
        if looks_local(value):
            path = Path(value.removeprefix("file://")).expanduser()
            if not path.exists():
                problems.append(
                    f"{field}: local path {shown(value)} does not exist; allowed: an existing "
                    "directory, a Hugging Face id, or an embedded: name"
                )
    return problems


def _near_name(path: Path) -> str | None:
    """A name in ``path``'s folder close to its own ('qa.jsnol' -> 'qa.jsonl'), as ``path``
    would be written with it; None when the folder is not there or nothing is close. Reads
    at most 1000 entries: a huge folder is not listed for a hint."""
    import difflib
    from itertools import islice

    try:
        with os.scandir(path.parent if str(path.parent) else ".") as it:
            names = [e.name for e in islice(it, 1000)]
    except OSError:
        return None
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
    return str(path.parent / close[0]) if close else None


def _output_aliases_input(spec: JobSpec, input_path: Path, run_date: str | None) -> list[str]:
    """The output resolving (symlinks followed) to the input or a place inside it.

    JobSpec already refuses the same location spelled differently (``file://``, ``..``);
    only this machine's filesystem knows that ``out`` is a symlink into the corpus.
    """
    out = spec.output.uri.replace("{job}", spec.name)
    if run_date is not None:
        out = out.replace("{run_date}", run_date)
    if _scheme(out) not in (None, "file") or "{" in out:
        return []
    real_in = os.path.realpath(input_path)
    real_out = os.path.realpath(Path(out.removeprefix("file://")).expanduser())
    if real_out == real_in or real_out.startswith(real_in.rstrip("/") + "/"):
        return [
            f"output.uri: {shown(spec.output.uri)} resolves to {shown(real_out)}, the input.uri "
            f"{shown(spec.input.uri)} or inside it (through a symlink); allowed: a location outside the input"
        ]
    return []


# ----------------------------------------------------------------------------- run values
