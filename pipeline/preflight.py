"""Preflight: the storage and input checks `validate` and `run` make before any model loads.

Contract: ``preflight(spec, run_date)`` returns problems as one line each, naming the
field or URI and the fix; an empty list means the run can read its input and write its
output with the credentials of this process. It takes seconds: object stores are asked
with a short connect timeout and no retries, and only the first records of the first
input file are read, and the first documents as the read stage reads them (up to
pipeline/fits.py ``FIRST_DOCUMENTS``, over as many files as it takes). Nothing is left
behind: the output's test object (or, on a local disk, a test file in the nearest existing
folder) is removed, and no folder is created.

What it checks:
- the input is listed with the run's credentials (remote inputs too: a missing key, an
  unreachable endpoint or a denied listing is a line, not a traceback later);
- the first ``PREFLIGHT_RECORDS`` records of the first JSONL/Parquet file hold the id,
  text and question fields (and the answer field when set): a field that none of them
  has would turn every document into an ``input`` error row after the model loaded;
- the first documents are not all error rows where they stand for the whole input (one
  file, all its documents, or the ``input.limit`` ones): ``_first_documents_all_fail``;
- for a method that prefills each document whole (``none``), the first documents fit the
  model's context: all of them too long is a line (pipeline/fits.py);
- the output is test-written and the test object removed: on object stores in the output
  root's sibling ``{root}.runs/`` (where the run records go, stages/layout.py ``runs_root``;
  a permission scoped to the root alone would fail there), never inside the root.
- a local output tree holds no symbolic link where the date's run would read, write or
  delete (stages/links.py ``planted_links``; the output root itself may be a link).

- each model the run loads is found where the run loads it (``models_here``: this
  machine, when no Ray cluster is named; pipeline/model_checks.py); the GPUs it asks are
  counted the same way.

An input whose URI holds ``{run_date}`` is checked only when a run date is given
(`validate` has none); the output root is resolved with the run date, or today's.
Imports neither Ray nor torch, except that a spec asking for GPUs on this machine has them
counted (``_check_gpus``: the device backends' count, as the run counts them).
"""

from __future__ import annotations

import errno
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import fsspec

from pipeline.local_write import write_error
from pipeline.memory_fit import kv_budget_problems, memory_problems
from pipeline.model_checks import model_problems
from schemas.checks import shown
from schemas.spec import FORMAT_SUFFIXES, InputSpec, JobSpec
from stages.layout import runs_root
from stages.links import LinkedOutput, planted_links

#: How many records of the first input file the field check reads.
PREFLIGHT_RECORDS = 20
#: Seconds an object store may take to accept a connection during preflight.
CONNECT_TIMEOUT_S = 2.0

_CREDENTIALS_FIX = ("fix: export AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) where the job "
                    "runs; on a cluster, `longdoc render --secret NAME` (Kubernetes) or `longdoc submit --env "
                    "AWS_PROFILE` (Ray Jobs)")


def preflight(spec: JobSpec, run_date: str | None, models_here: bool = True) -> list[str]:
    """Problems that would stop ``spec`` after its model loaded, one line each (see the module).
    ``models_here``: the run loads its models on this machine (no Ray cluster named)."""
    problems = input_problems(spec, run_date)
    from pipeline.fits import first_fit, prefills_whole

    if not problems and prefills_whole(spec):
        fit = first_fit(spec, run_date)
        problems += [fit.refusal()] if fit is not None and fit.refusal() else []
    problems += _check_output(spec, run_date)
    problems += kv_budget_problems(spec)  # pipeline/memory_fit.py: the budget's own size, anywhere
    if models_here:
        problems += model_problems(spec)  # pipeline/model_checks.py
        problems += _check_gpus(spec)
        problems += memory_problems(spec)  # pipeline/memory_fit.py: this machine's memory
    return problems


def _check_gpus(spec: JobSpec) -> list[str]:
    """GPUs the spec asks of this machine that it does not have (pipeline/placement.py
    ``check_fits``, the run's own check). Only a spec that asks for GPUs pays for asking the
    device backends (torch's import, a few seconds)."""
    if spec.resources.num_gpus == 0 and spec.resources.compress_num_gpus == 0:
        return []
    from pipeline.placement import check_fits

    try:
        check_fits(spec, "local")
    except ValueError as e:
        return [str(e)]
    return []


def _remote(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """A filesystem for ``uri`` that fails fast (object stores: short connect timeout, one attempt)."""
    if uri.startswith("s3://"):
        return fsspec.core.url_to_fs(uri, skip_instance_cache=True, config_kwargs={
            "connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": 10, "retries": {"max_attempts": 1}})
    return fsspec.core.url_to_fs(uri)


#: S3's words for a key it does not know or a secret that does not match (botocore's
#: error text; s3fs hands them on as PermissionError like a missing permission).
_BAD_KEY = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "Access Key Id you provided does not exist",
            "request signature we calculated does not match")


#: ``storage_problem``'s words for a store this process holds no credentials for.
NO_CREDENTIALS = "no credentials for the object store"


def lacks_credentials(problem: str) -> bool:
    """Whether ``problem`` (a line of ``storage_problem``) says this process holds no credentials
    for the object store: where a job runs elsewhere (`longdoc submit`), a note, not a refusal."""
    return f": {NO_CREDENTIALS} (" in problem


#: ``storage_problem``'s words for a store this process cannot use (not reached, key not
#: accepted, permission denied), whose cluster may hold what this machine lacks.
NO_ACCESS = ("cannot reach the object store", "the object store does not accept these credentials",
             "permission denied to")


def lacks_access(problem: str) -> bool:
    """Whether ``problem`` (a line of ``storage_problem``) says this process cannot use the store
    (``NO_ACCESS``): `longdoc submit` then names ``--skip-storage``."""
    return any(f": {words}" in problem for words in NO_ACCESS)


#: botocore's and google-auth's errors (or their bases) for credentials this process lacks or
#: cannot use: none found, a profile or token missing or expired, a login or credential_process
#: that failed.
_NO_CREDENTIALS_ERRORS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "ProfileNotFound", "DefaultCredentialsError",
    "SSOError", "UnauthorizedSSOTokenError", "SSOTokenLoadError", "TokenRetrievalError",
    "CredentialRetrievalError", "LoginError", "LoginRefreshRequired", "LoginTokenLoadError", "NoAuthTokenError"})


def storage_problem(field: str, uri: str, err: BaseException) -> str:
    """One line for a storage failure on ``uri`` (the spec's ``field``): what failed and the fix."""
    name = type(err).__name__
    first = (str(err).strip().splitlines() or [""])[0][:300]
    where = f"{field}: {shown(uri)}"
    # (An expired `aws sso login` or a failing credential_process raise their own errors,
    # which s3fs passes through: this machine's credentials are as good as none.)
    if _NO_CREDENTIALS_ERRORS & {c.__name__ for c in type(err).__mro__}:
        return f"{where}: {NO_CREDENTIALS} ({first}); {_CREDENTIALS_FIX}"
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                "ConnectionRefusedError", "ConnectionError", "TimeoutError", "ServerTimeoutError"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint"
        return (f"{where}: cannot reach the object store at {endpoint} ({first}); fix: check "
                "AWS_ENDPOINT_URL and the network (or the secret's endpoint on a cluster)")
    if any(code in first for code in _BAD_KEY):  # the key itself, not its permissions
        return (f"{where}: the object store does not accept these credentials ({first}); fix: check the "
                "access key id and secret (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the profile's), "
                "and that they belong to this endpoint")
    if isinstance(err, PermissionError) or "AccessDenied" in first or "Forbidden" in first:
        verb = "write to" if field.startswith("output") else "list or read"
        return (f"{where}: permission denied to {verb} it with this process's credentials ({first}); "
                "fix: grant the permissions (object stores: s3:ListBucket, s3:GetObject, s3:PutObject, "
                "s3:DeleteObject), use another AWS_PROFILE or --secret, or choose another location")
    if isinstance(err, FileNotFoundError):
        return f"{where}: not found ({first}); fix: create the bucket or folder, or correct {field}"
    return f"{where}: {name}: {first}"


def readable_problem(name: str, uri: str) -> str | None:
    """One line when ``uri`` (what the user called ``name``) cannot be listed from here, else
    None: an object store is asked once with a short timeout (`longdoc report`'s first step:
    reading the table goes through the retrying client, which took 33 s to give up on a
    stopped endpoint and then printed botocore's traceback). A missing path is not a
    problem here (its reader says it has no rows)."""
    if not _remote(uri):
        return None
    try:
        fs, path = _fs(uri)
        fs.ls(path)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - every storage failure becomes one line
        return storage_problem(name, uri, e)
    return None


# ----------------------------------------------------------------------------- input
def input_problems(spec: JobSpec, run_date: str | None) -> list[str]:
    """The input half of ``preflight``, one line per problem ([] when the run can read it):
    the resolved input is listed with this process's credentials (a missing bucket or prefix,
    no file of the format, all files empty) and its first records checked (see the module).
    `longdoc submit` asks it before the cluster is (pipeline/ops/submit.py); a store this
    process holds no credentials for is the one line ``lacks_credentials`` tells apart."""
    from stages.listing import list_shards, resolve_uri

    inp = spec.input
    if "{run_date}" in inp.uri and run_date is None:
        return []
    uri = resolve_uri(inp.uri, run_date or "")
    if _remote(uri):
        try:  # fast: an unreachable endpoint or a missing key fails in about a second
            fs, path = _fs(uri)
            # What the run does first, asked cheaply: one small request (a HEAD, a list of one
            # key), not a full listing of a large prefix that list_shards lists again.
            fs.info(path)
        except FileNotFoundError:
            pass  # list_shards below names the missing prefix as the run would
        except PermissionError as e:  # S3 answers a HEAD of the prefix 403 under a policy that
            # lets this role list the prefix and read below it only: the listing decides
            if any(code in str(e) for code in _BAD_KEY):
                return [storage_problem("input.uri", uri, e)]
        except Exception as e:  # noqa: BLE001 - every storage failure becomes one line
            return [storage_problem("input.uri", uri, e)]
    try:
        shards = list_shards(inp, run_date or "")
    except ValueError as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001
        return [storage_problem("input.uri", uri, e)]
    if not shards:
        return []
    if empty := _all_empty(shards):
        return [empty]
    if inp.format == "text":
        return _first_documents_all_fail(spec, run_date, shards)
    try:
        fields, n, bad, records = _first_records(shards[0], inp.format)
    except Exception as e:  # noqa: BLE001
        from stages.read import corrupt_compression

        why = corrupt_compression(shards[0], e)
        if why is None:
            return [storage_problem("input.uri", shards[0], e)]
        # A broken file among others is the read stage's to report, as that file's error row.
        return [f"input.uri: {shown(shards[0])} {why}"] if len(shards) == 1 else []
    if not n and bad and inp.format == "parquet":  # refused alone, as a broken .gz is; among others a row
        return [f"input.uri: {shown(shards[0])} is {bad[0]}; fix: export it again, or set input.format to the "
                "file's format"] if len(shards) == 1 else []
    if not n and bad and "UTF-16" in bad[0]:  # the reader makes such a file one error row (stages/read.py)
        why = bad[0].split(": ", 1)[-1]
        return [f"input.uri: {shown(shards[0])} is {why}"] if len(shards) == 1 else []
    if not n and bad:  # not one record: the wrong format or a broken file, not a stray bad line
        return [f"input.uri: {shown(shards[0])}: none of its first {len(bad)} line(s) is a JSON record "
                f"(line {bad[0].split('; fix: ')[0]}); fix: one JSON object per line (input.format jsonl), or set input.format "
                "to the file's format"]
    if not n and not bad and len(shards) == 1 and inp.format == "jsonl":
        return [f"input.uri: {shown(shards[0])} holds no record (blank lines only): the run would have "
                "nothing to do; fix: check what writes it, or point input.uri at the data"]
    if not n:
        return []  # an empty file among others, or not Parquet: the read stage reports it as a row
    wanted = [("input.id_field", inp.id_field), ("input.text_field", inp.text_field),
              ("input.question_field", inp.question_field), ("input.answer_field", inp.answer_field)]
    have = ", ".join(sorted(fields)[:12]) or "none"
    missing = [
        f"input.uri: {shown(shards[0])}: none of its first {n} record(s) has the field {value!r} "
        f"({name}); fields there: {have}; fix: set {name} to the field that holds it"
        for name, value in wanted if value and value not in fields
    ]
    return missing or _answers_problems(shards[0], records, inp) or _first_documents_all_fail(spec, run_date, shards)


def _first_documents_all_fail(spec: JobSpec, run_date: str | None, shards: list[str]) -> list[str]:
    """Refused when the documents the run reads first would all be error rows (pipeline/fits.py
    ``first_documents``: the read stage's own reading) and they stand for the whole input: the
    input is one file, or every document of it is among them, or they are the ``input.limit``
    documents the run reads. Such a run loaded the model to write error rows only (a text field
    of numbers, ids all booleans, every document over ``input.max_doc_bytes``). A folder whose
    first files alone are bad is not refused: its other files are the night's work (`validate`
    names the error rows, ``first_records_note``; ``--max-failed-fraction`` judges the date)."""
    from pipeline.fits import FIRST_DOCUMENTS, first_documents

    try:
        docs = first_documents(spec, run_date or "", shards)
    except (OSError, ValueError, EOFError):  # a file the listing named is gone or unreadable now: the run's rows
        return []
    limit = spec.input.limit
    if limit is not None:
        docs = docs[:limit]
    whole = (len(shards) == 1 or (limit is not None and len(docs) >= limit)
             or (len(docs) < FIRST_DOCUMENTS and len(shards) <= FIRST_DOCUMENTS))
    if not docs or not whole or any(d.error is None for d in docs):
        return []
    what = "document(s)" if spec.input.format == "text" else "record(s)"
    return [f"input.uri: all of its first {len(docs)} {what} would be error rows (the run would answer none of "
            f"them); the first: {docs[0].error}"]


def _all_empty(shards: list[str]) -> str | None:
    """A line when every listed file is empty (0 bytes; only checked up to
    ``PREFLIGHT_RECORDS`` files): an upstream job that wrote empty files would otherwise make
    a night that "succeeds" with no rows."""
    if len(shards) > PREFLIGHT_RECORDS:
        return None
    fs, _ = _fs(shards[0])
    try:
        if any(fs.size(fsspec.core.url_to_fs(s)[1]) for s in shards):
            return None
    except Exception:  # noqa: BLE001 - a size the store will not tell: the read stage reads the files
        return None
    return (f"input.uri: its {len(shards)} file(s) are all empty ({shown(shards[0])}, ...): the run would have "
            "nothing to do; fix: check what writes them, or point input.uri at the data")


def _answers_problems(path: str, records: list[tuple[str, dict]], inp: InputSpec) -> list[str]:
    """Refused when every one of the first records that has both fields breaks the pairing
    of answers with questions (stages/record_fields.py ``pairing_problem``): the sign of a field in
    another shape than the spec says, not of a stray record. A stray one is error rows, as
    past the first records; `validate` names it (``first_records_note``)."""
    from stages.record_fields import pairing_problem

    both = [(where, rec) for where, rec in records
            if rec.get(inp.question_field or "") is not None and rec.get(inp.answer_field or "") is not None]
    problems = [(where, pairing_problem(rec, inp)) for where, rec in both]
    if not both or not all(problem for _, problem in problems):
        return []
    where, problem = problems[0]
    # A questions field of another shape (a number: stages/record_fields.py) is the question
    # field's fault, not the answers'.
    field = "input.question_field" if problem.startswith(f"field {inp.question_field!r} ") else "input.answer_field"
    return [f"{field}: {shown(path)}: all of its first {len(both)} record(s) with questions and answers "
            f"break their pairing; {where}: {problem}"]


def _first_records(path: str, fmt: str) -> tuple[set[str], int, list[str], list[tuple[str, dict]]]:
    """Over the first records of ``path`` (at most ``PREFLIGHT_RECORDS``): the union of
    their field names, how many were read, the lines that are not a record ("N: why"), and
    the records themselves with where they are ("line N" / "row N")."""
    from stages.read import iter_lines, open_input, parse_line, read_options

    fs, bare = _fs(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fs.open(bare, "rb", **read_options(fs)) as f:
            try:
                pf = pq.ParquetFile(f)
            except OSError:
                raise  # storage, as the read stage says it (pyarrow's own errors are not OSError)
            except Exception as e:  # noqa: BLE001 - not Parquet: the read stage reports it as a row
                return set(), 0, [f"not a readable Parquet file ({e})"], []
            first = next(pf.iter_batches(batch_size=PREFLIGHT_RECORDS), None)
            rows = first.to_pylist() if first is not None else []
            return (set(pf.schema_arrow.names), min(pf.metadata.num_rows, PREFLIGHT_RECORDS), [],
                    [(f"row {i}", r) for i, r in enumerate(rows)])
    fields: set[str] = set()
    bad: list[str] = []
    records: list[tuple[str, dict]] = []
    with open_input(bare, fs) as f:
        for lineno, raw, _ in iter_lines(f, 1 << 26):
            if raw is None or not raw.strip():
                continue
            rec, why = parse_line(lineno, raw)
            if why is not None:
                bad.append(f"{lineno}: {why}")
            if isinstance(rec, dict):
                fields.update(k for k, v in rec.items() if v is not None)
                records.append((f"line {lineno}", rec))
            elif rec is not None:
                bad.append(f"{lineno}: not a JSON object")
            if len(records) >= PREFLIGHT_RECORDS or len(bad) >= PREFLIGHT_RECORDS:
                break
    return fields, len(records), bad, records


# ----------------------------------------------------------------------------- output
def _check_output(spec: JobSpec, run_date: str | None) -> list[str]:
    date = run_date or datetime.now(timezone.utc).date().isoformat()
    root = spec.output.uri.replace("{job}", spec.name).replace("{run_date}", date)
    if _remote(root):
        probe = f"{runs_root(root)}/.longdoc-preflight-{uuid.uuid4().hex[:8]}"
        try:
            fs, path = _fs(probe)
            fs.pipe_file(path, b"")
            fs.rm_file(path)
        except Exception as e:  # noqa: BLE001
            return [storage_problem("output.uri", root, e)]
        return []
    return _check_local_output(root) + _link_problems(root, date)


def _link_problems(root: str, run_date: str) -> list[str]:
    """A link planted in the local output tree of ``run_date`` (stages/links.py): the run's
    lease refuses it too, but `validate` says so here, before a run is scheduled."""
    return [f"output.uri: {LinkedOutput(link, target, root)}" for link, target in planted_links(root, run_date)]


def _check_local_output(root: str) -> list[str]:
    """Test-write a file in the nearest existing folder of ``root`` (no folder is created)."""
    here, e = write_error(Path(root.removeprefix("file://")))
    if isinstance(e, NotADirectoryError):
        return [f"output.uri: {shown(root)}: {shown(str(here))} is a file, not a folder; fix: choose an "
                "output.uri whose folders can be created"]
    if e is not None:
        # Only a permission is the user's to grant; /proc, a read-only mount or a full disk are not.
        fix = ("grant this user write permission there (chmod/chown), or choose another output.uri"
               if e.errno in (errno.EACCES, errno.EPERM) else "choose an output.uri on a writable disk")
        return [f"output.uri: {shown(root)}: cannot write in {shown(str(here))} ({e.strerror or e}); fix: {fix}"]
    return []


# ----------------------------------------------------------------------------- models
def first_records_note(spec: JobSpec, run_date: str | None) -> str:
    """What the reader makes of the first documents (records, or files of a text folder), in
    words, for `validate`'s last line ('' when every one is a document): a bad line or an
    empty file among good ones is an error row of `run`, not a refusal, and `validate` says
    so beforehand with the reader's own message (the same code reads them: stages/read.py
    ``iter_shard``, through pipeline/fits.py ``first_documents``)."""
    from pipeline.fits import first_documents

    if "{run_date}" in spec.input.uri and run_date is None:
        return ""
    try:
        docs = first_documents(spec, run_date or "")
    except Exception:  # noqa: BLE001 - a listing or storage problem is the preflight's to say
        return ""
    bad = [d for d in docs if d.error is not None]
    if not bad:
        return ""
    what = "document(s)" if spec.input.format == "text" else "record(s)"
    where = {"text": "file", "parquet": "row"}.get(spec.input.format, "line")
    return (f" ({len(bad)} of its first {len(docs)} {what} will be error rows, each naming its {where}; "
            f"the first: {bad[0].error})")


def skipped_note(spec: JobSpec, run_date: str | None) -> str:
    """The files of a folder input its format does not read, in words, for `validate`'s
    last line ('' when none): a folder of mixed files does not lose some without a word."""
    from stages.listing import skipped_suffixes

    try:
        other = skipped_suffixes(spec.input, run_date or "")
    except Exception:  # noqa: BLE001 - a listing problem is the preflight's to say, not this note's
        return ""
    if not other:
        return ""
    kinds = ", ".join(f"{n} {s or 'without a suffix'}" for s, n in sorted(other.items(), key=lambda kv: -kv[1]))
    return (f" (files it does not read, skipped: {kinds}; input.format {spec.input.format} reads "
            f"{', '.join(FORMAT_SUFFIXES[spec.input.format])})")
