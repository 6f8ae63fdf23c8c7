"""Submit a job spec to a Ray cluster through the Ray Jobs API; follow, inspect, tail it.

Contract:
- ``submit`` validates the spec and every ``--set`` override *locally* first, so a bad
  spec never reaches the cluster. The spec file travels with the job in the
  runtime_env ``working_dir`` (a fresh folder holding only the spec, or the folder
  named by ``--working-dir``); the entrypoint is ``longdoc run <spec> --date D
  [--set k=v ...]``, so the cluster validates and runs exactly what the user wrote.
- The submission id is ``longdoc-<job name>-<run date>`` (plus ``-<suffix>`` with
  ``--suffix``). Ray refuses a second job with the same id, so a nightly job cannot
  run twice for one date; a deliberate rerun (say after a failure) passes ``--suffix``
  and resumes: ``longdoc run`` skips requests already written for that date.
- Secrets: nothing read from the environment is printed, logged or put in job
  metadata. ``--env NAME`` copies the *named* variables into the job's runtime_env
  ``env_vars`` only when asked (their values are then visible to anyone who can read
  the cluster's job API, and in the head node's runtime_env log: a variable named like a
  secret gets a note saying so; prefer cluster-side secrets, see infra/README.md).
- An object-store input (``s3://``, ``gs://``: what this machine and the cluster both reach
  by URI) is listed for the run date and its first records checked here, before the cluster
  is asked: the input half of the preflight `validate --date` and `run` make
  (pipeline/preflight.py ``input_problems``), refused with their lines and exit 2, so a typo
  in the bucket or prefix, a night folder that has not arrived or an empty one is not found
  on the cluster after the job (or, with KubeRay, a cluster) started. Where this machine holds
  no credentials for the store, one note says the input was not checked and the job goes on
  (the cluster may hold its own); ``--skip-storage`` leaves the check to the cluster, as
  `validate --skip-storage` does. A local path resolves on the cluster's nodes, so it is not
  listed here.
- A relative ``output.uri`` is refused (on the cluster it resolves inside Ray's temporary
  copy of the uploaded folder, deleted with it), and so is a relative ``input.uri`` unless
  ``--working-dir`` uploads the folder holding it.
- The cluster image must contain the project (infra/Dockerfile). ``--ship-code``
  uploads this checkout's ``pipeline``/``stages``/``schemas`` packages as runtime_env
  ``py_modules`` for a cluster whose image lacks them or runs an older version (its
  Python dependencies must still be installed there).
- ``stop`` asks Ray to stop a job: Ray sends its driver SIGTERM, and the run records
  itself as ``interrupted`` with its staged rows kept (pipeline/runner.py). Ray kills a
  driver still alive ``RAY_JOB_STOP_WAIT_TIME_S`` after the signal (3 s by default, too
  short for a run to write its record): ``submit`` sets it to ``STOP_GRACE_S`` in the
  job's runtime_env (its supervisor reads it there) unless ``--env`` passes the user's own.
- Exit codes: 0 submitted (or, with ``--wait``, job SUCCEEDED); 1 cluster/job failure
  (with ``--wait``, the job's driver exit code when it has one); 2 bad user input.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from schemas.checks import without_userinfo

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from schemas.spec import JobSpec

#: Paths never uploaded with ``--working-dir``: virtualenvs and outputs (they can be GBs),
#: and files that hold credentials by their usual names (Ray keeps the package where anyone
#: with the dashboard reads it: a review found `.env`, `id.pem` and `.aws/credentials` in it).
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "out", "__pycache__", "*.egg-info", ".pytest_cache",
                        ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", ".aws", ".ssh", ".gnupg", ".netrc",
                        ".git-credentials", ".pgpass", ".docker", ".kube", "credentials", "credentials.json",
                        "*-credentials.json", "service-account*.json", ".s3cfg", ".boto", "*.keytab",
                        "id_rsa*", "id_ed25519*", "id_ecdsa*"]
_PROJECT_PACKAGES = ("pipeline", "stages", "schemas")
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_JOBS_ADDRESS = re.compile(r"^https?://[^\s/?#]+(/[^\s]*)?\Z")
#: Seconds Ray waits after a stop's SIGTERM before it kills the driver (module contract).
STOP_GRACE_S = 60
_STOP_GRACE_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")

AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        envvar="RAY_API_SERVER_ADDRESS",
        help="Ray dashboard / Jobs API address, e.g. http://HOST:8265 "
        "(default: $RAY_API_SERVER_ADDRESS).",
    ),
]


def resolve_run_date(value: str | None) -> str:
    """``value`` checked as YYYY-MM-DD, or today's date in UTC when None."""
    if value is None:
        return datetime.now(timezone.utc).date().isoformat()
    from schemas.loading import check_run_date

    return check_run_date(value)  # SpecError, a ValueError, naming --date and YYYY-MM-DD


def submission_id_for(job_name: str, run_date: str, suffix: str | None = None) -> str:
    """``longdoc-<name>-<date>[-<suffix>]``: one nightly submission per job and date."""
    sid = f"longdoc-{job_name}-{run_date}"
    if suffix:
        if _ID_UNSAFE.search(suffix):
            raise ValueError(f"suffix {suffix!r} may only hold letters, digits, '.', '_', '-'")
        sid += f"-{suffix}"
    return sid


def build_entrypoint(
    spec_relpath: str,
    run_date: str,
    overrides: list[str],
    run_id: str | None = None,
    max_failed_fraction: float | None = None,
    program: str = "longdoc",
) -> str:
    """The shell command the job driver runs; every user value is shell-quoted."""
    # --runner ray: the job runs on the cluster's Ray, whatever `auto` would pick (it picks Ray
    # there too, from the RAY_ADDRESS that Ray Jobs gives its drivers; explicit is sturdier).
    parts = [program, "run", shlex.quote(spec_relpath), "--date", run_date, "--runner", "ray"]
    for item in overrides:
        parts += ["--set", shlex.quote(item)]
    if run_id is not None:
        parts += ["--run-id", shlex.quote(run_id)]
    if max_failed_fraction is not None:
        parts += ["--max-failed-fraction", repr(float(max_failed_fraction))]
    return " ".join(parts)


def _env_vars(names: list[str]) -> dict[str, str]:
    import os

    missing = [n for n in names if n not in os.environ]
    if missing:
        raise ValueError(f"--env names unset environment variables: {', '.join(missing)}")
    return {n: os.environ[n] for n in names}


def _relative_spec(spec: Path, working_dir: Path) -> str:
    try:
        return spec.resolve().relative_to(working_dir.resolve()).as_posix()
    except ValueError:
        raise ValueError(f"spec {spec} is not inside --working-dir {working_dir}") from None


def _local_path_notes(uris: dict[str, str]) -> list[str]:
    """Warn about spec URIs that point at a disk (an absolute path: a volume the nodes may share)."""
    notes = []
    for field, uri in uris.items():
        if "://" not in uri or uri.startswith("file://"):
            notes.append(
                f"note: {field}={uri!r} is a local path; it resolves on the cluster's nodes, "
                "not on this machine (use s3:// or a shared volume)"
            )
    return notes


def relative_path_problems(input_uri: str, output_uri: str, shipped: bool) -> list[str]:
    """The spec's relative paths that cannot work on a cluster, where the job's working
    directory is Ray's temporary copy of the uploaded folder: an output there is deleted
    with it (a submitted job "succeeded" with its rows under /tmp/ray/.../_ray_pkg_*/out),
    and an input there exists only when ``--working-dir`` uploaded it (``shipped``)."""
    def relative(uri: str) -> bool:
        path = uri.removeprefix("file://")
        return "://" not in path and not path.startswith(("/", "~"))

    fix = "fix: s3:// or gs://, or an absolute path every node of the cluster shares"
    out = []
    if relative(input_uri) and not shipped:
        out.append(f"input.uri: {input_uri!r} is a relative path, and only the spec travels to the cluster; "
                   f"{fix} (or --working-dir FOLDER to upload a folder that holds it)")
    if relative(output_uri):
        out.append(f"output.uri: {output_uri!r} is a relative path, which on the cluster resolves inside the "
                   f"job's temporary copy of the uploaded folder (Ray deletes it); {fix}")
    return out


#: Names of --env variables whose values are secrets (module contract: they stay in Ray's job record).
_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|_KEY\b|KEY_ID|PRIVATE", re.IGNORECASE)


def secret_env_note(names: list[str]) -> str | None:
    """A note when ``--env`` carries a secret's value to the cluster (module contract)."""
    secret = sorted(n for n in names if _SECRET_NAME.search(n))
    if not secret:
        return None
    return (f"note: Ray keeps --env values in the job's runtime environment ({', '.join(secret)}): anyone who "
            "can read this cluster's Jobs API or dashboard can read them, and the head node's runtime_env "
            "log holds them; prefer credentials the nodes have (an instance role, AWS_PROFILE with the "
            "nodes' own credential files, `longdoc render --secret` on Kubernetes)")


def _object_store(uri: str) -> bool:
    """A URI this machine and the cluster both reach by name: not a local path (it resolves on
    the cluster's nodes) nor ``memory://`` (a filesystem of one process)."""
    return "://" in uri and not uri.startswith(("file://", "memory://"))


def input_check(job: JobSpec, run_date: str) -> tuple[list[str], list[str]]:
    """(refusals, notes) for the input of ``job`` on ``run_date``, asked from this machine (module
    contract): refusals are `validate`'s own lines (pipeline/preflight.py ``input_problems``);
    a store this machine holds no credentials for is a note instead, naming no secret. A local
    input gives neither, and nor does one whose filesystem package (s3fs, gcsfs) this machine
    lacks: submit's note on the package says so (the cluster image needs it, not this machine)."""
    from pipeline.preflight import NO_CREDENTIALS, input_problems, lacks_access, lacks_credentials
    from schemas.checks import shown
    from schemas.environment import check_environment
    from stages.listing import resolve_uri

    if not _object_store(job.input.uri) or any(
            p.startswith("input.uri:") for p in check_environment(job, local_paths=False)):
        return [], []
    problems = input_problems(job, run_date)
    if any(lacks_credentials(p) for p in problems):
        uri = resolve_uri(job.input.uri, run_date)
        return [], [f"note: input.uri {shown(uri)} not checked: {NO_CREDENTIALS} on this machine; the cluster "
                    "reads it with its own credentials (--skip-storage skips this check)"]
    # The store refused or could not be reached from here (another role, an expired token, an
    # endpoint only the cluster resolves): the cluster may still read it, so the way round is named.
    return [p + ("; or --skip-storage if only the cluster reaches the store" if lacks_access(p) else "")
            for p in problems], []


def check_jobs_address(address: str) -> str:
    """``address`` if it is an HTTP(S) URL (the Jobs API of a Ray dashboard), else ValueError.

    Without a scheme Ray's client takes ``HOST:PORT`` for a GCS address and dials it for
    20 s and more before failing; a typo must fail at once.
    """
    if not _JOBS_ADDRESS.match(address):
        host = address.strip().rsplit(":", 1)[0] if address.strip() else ""
        hint = (f" (HOST:PORT is how `longdoc run --address` names a cluster's GCS; the Jobs API is the "
                f"dashboard's URL, e.g. http://{host}:8265)" if "://" not in address and host else "")
        raise ValueError(
            f"--address {without_userinfo(address)!r} is not the Jobs API's URL{hint}; allowed: http://HOST:PORT or "
            "https://HOST:PORT, the Ray dashboard's address (port 8265 by default)"
        )
    return address


def _client(address: str | None) -> JobSubmissionClient:
    from ray.job_submission import JobSubmissionClient

    if not address:
        typer.echo("error: no cluster: pass --address http://HOST:8265 or set "
                   "RAY_API_SERVER_ADDRESS", err=True)
        raise typer.Exit(2)
    try:
        check_jobs_address(address)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    from ray.exceptions import AuthenticationError

    try:
        return JobSubmissionClient(address)
    except AuthenticationError as e:
        # The cluster uses Ray token auth; never echo a token, only where to put it.
        typer.echo(
            f"error: the Ray cluster at {without_userinfo(address)} refused the request "
            f"({str(e).splitlines()[0]}). Set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH) to the cluster's token.",
            err=True,
        )
        raise typer.Exit(1) from None
    except (ConnectionError, RuntimeError, ValueError) as e:
        typer.echo(f"error: cannot reach the Ray Jobs API at {without_userinfo(address)}: "
                   f"{without_userinfo(str(e))}", err=True)
        raise typer.Exit(1) from None


def _existing_status(client: JobSubmissionClient, sid: str) -> str | None:
    """The status of job ``sid``, or None if the cluster has no such job."""
    try:
        return str(client.get_job_status(sid).value)
    except RuntimeError as e:  # the client raises RuntimeError on HTTP 404
        if "404" in str(e) or "does not exist" in str(e):
            return None
        raise


def submit(
    spec: Annotated[Path, typer.Argument(help="Job spec YAML.")],
    address: AddressOpt = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec field: dotted.key=value.")
    ] = None,
    run_date: Annotated[
        str | None, typer.Option("--date", help="Run date YYYY-MM-DD (default: today, UTC).")
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id passed to longdoc run.")] = None,
    max_failed_fraction: Annotated[
        float | None, typer.Option("--max-failed-fraction", help="Passed to longdoc run.")
    ] = None,
    suffix: Annotated[
        str | None,
        typer.Option("--suffix", help="Append to the submission id to submit a job/date again."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Stream logs; exit with the job's status.")] = False,
    working_dir: Annotated[
        Path | None,
        typer.Option("--working-dir", help="Upload this folder (must contain the spec) "
                     "instead of the spec alone."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="Pass this environment variable (by name) to the job."),
    ] = None,
    ship_code: Annotated[
        bool, typer.Option("--ship-code", help="Upload this checkout's packages as py_modules.")
    ] = False,
    skip_storage: Annotated[
        bool, typer.Option("--skip-storage", help="Do not list an s3:// or gs:// input from this machine "
                           "before submitting: for a spec whose storage only the cluster reaches.")
    ] = False,
) -> None:
    """Submit SPEC to a Ray cluster through the Ray Jobs API."""
    from schemas.environment import check_environment
    from schemas.loading import SpecError, check_run_id, load_spec

    overrides = list(overrides or [])
    try:
        if address:
            check_jobs_address(address)
        run_date = resolve_run_date(run_date)
        if run_id is not None:
            check_run_id(run_id)
        job = load_spec(spec, overrides)
        from pipeline.plan import spec_problems  # a budget that can never fit fails here too

        if problems := spec_problems(job) + relative_path_problems(
                job.input.uri, job.output.uri, shipped=working_dir is not None):
            raise ValueError("; ".join(problems))
        sid = submission_id_for(job.name, run_date, suffix)
        env_vars = _env_vars(list(env or []))
        if max_failed_fraction is not None and not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"--max-failed-fraction: got {max_failed_fraction}; allowed: 0 to 1")
        rel = spec.name if working_dir is None else _relative_spec(spec, working_dir)
    except (SpecError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

    if not skip_storage:  # before the cluster is asked (module contract)
        refusals, notes = input_check(job, run_date)
        for line in notes:
            typer.echo(line, err=True)
        for problem in refusals:
            typer.echo(f"error: {problem}", err=True)
        if refusals:
            raise typer.Exit(2)
    from pipeline.date_lease import DATE_IN_USE_EXIT, live_holder
    from pipeline.runner import output_root

    if holder := live_holder(output_root(job, run_date), run_date):  # the job would exit 75 on the cluster
        typer.echo(f"error: {holder.describe(time.time())} writes {output_root(job, run_date)} for {run_date} "
                   "now: one run of a date at a time. Wait for it to end, or submit another --date.", err=True)
        raise typer.Exit(DATE_IN_USE_EXIT)
    client = _client(address)
    existing = _existing_status(client, sid)
    if existing is not None:
        typer.echo(
            f"error: job {sid} was already submitted (status {existing}); one submission per "
            f"job and date. See `longdoc status {sid}`; to submit again anyway pass "
            "--suffix (e.g. --suffix retry1): requests already written for the date are skipped.",
            err=True,
        )
        raise typer.Exit(1)

    tmp = None
    try:
        if working_dir is None:
            tmp = Path(tempfile.mkdtemp(prefix="longdoc-submit-"))
            shutil.copy2(spec, tmp / spec.name)
        root = tmp or working_dir.resolve()
        runtime_env: dict[str, Any] = {"working_dir": str(root), "excludes": WORKING_DIR_EXCLUDES}
        program = "longdoc"
        if ship_code:
            import importlib

            runtime_env["py_modules"] = [
                str(Path(importlib.import_module(p).__file__).parent) for p in _PROJECT_PACKAGES
            ]
            program = "python -m pipeline.cli"  # no console script on an image without the project
        # A stopped job gets time to record itself (module contract); the user's own value wins.
        runtime_env["env_vars"] = {_STOP_GRACE_ENV: str(STOP_GRACE_S), **env_vars}
        entrypoint = build_entrypoint(rel, run_date, overrides, run_id, max_failed_fraction, program)
        for note in _local_path_notes({"input.uri": job.input.uri, "output.uri": job.output.uri}):
            typer.echo(note, err=True)
        if secret := secret_env_note(list(env_vars)):
            typer.echo(secret, err=True)
        # The cluster reads and writes, so a filesystem package missing HERE is only a note.
        for problem in check_environment(job, local_paths=False):
            typer.echo(f"note: {problem} (on this machine; the cluster image needs it)", err=True)
        try:
            client.submit_job(
                entrypoint=entrypoint,
                submission_id=sid,
                runtime_env=runtime_env,
                metadata={"longdoc.job": job.name, "longdoc.run_date": run_date},
            )
        except RuntimeError as e:  # lost a race with another submitter, or upload failure
            if "already exists" in str(e):
                typer.echo(f"error: job {sid} was already submitted (concurrently).", err=True)
            else:
                typer.echo(f"error: submission of {sid} failed: {str(e).splitlines()[-1]}", err=True)
            raise typer.Exit(1) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    typer.echo(f"submitted {sid}")
    typer.echo(f"  entrypoint: {entrypoint}")
    if env_vars:
        typer.echo(f"  env vars passed (values not shown): {', '.join(sorted(env_vars))}")
    if not wait:
        typer.echo(f"  follow with: longdoc logs {sid} --follow   status: longdoc status {sid}")
        return
    raise typer.Exit(_follow_and_exit_code(client, sid))


def _follow_and_exit_code(client: JobSubmissionClient, sid: str) -> int:
    """Stream the job's logs until it ends; 0 if it SUCCEEDED, else its driver's exit code or 1."""
    import asyncio
    import time

    from ray.job_submission import JobStatus

    async def _tail() -> None:
        async for chunk in client.tail_job_logs(sid):
            typer.echo(chunk, nl=False)

    try:
        asyncio.run(_tail())
        status = client.get_job_status(sid)
        while not status.is_terminal():  # the log stream can close a moment before the status
            time.sleep(0.5)
            status = client.get_job_status(sid)
    except KeyboardInterrupt:
        typer.echo(f"\nstopped following; the job keeps running: longdoc logs {sid} --follow", err=True)
        return 130
    info = client.get_job_info(sid)
    typer.echo(f"job {sid} finished: {status.value}")
    if status == JobStatus.SUCCEEDED:
        return 0
    lines = [line.strip() for line in (info.message or "").splitlines() if line.strip()]
    if lines:
        # Ray's message is a heading ("... last available logs (truncated ...):") and then the
        # logs: their last line is the job's own error.
        said = lines[0] + (f" ... {lines[-1]}" if lines[0].endswith(":") and len(lines) > 1 else "")
        typer.echo(f"  {said}", err=True)
    return info.driver_exit_code or 1


def _fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def status(
    submission_id: Annotated[
        str | None, typer.Argument(help="Submission id; omit to list longdoc jobs.")
    ] = None,
    address: AddressOpt = None,
) -> None:
    """Show one job's status, or list the cluster's longdoc jobs. Exit 1 if the id is unknown."""
    client = _client(address)
    if submission_id is None:
        jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("longdoc.job")]
        for j in sorted(jobs, key=lambda j: j.start_time or 0):
            typer.echo(f"{j.submission_id}\t{j.status.value}\t{_fmt_ms(j.start_time)}")
        if not jobs:
            typer.echo("no longdoc jobs on this cluster")
        return
    if _existing_status(client, submission_id) is None:
        typer.echo(f"error: no job {submission_id!r} on {without_userinfo(address or '')}", err=True)
        raise typer.Exit(1)
    info = client.get_job_info(submission_id)
    # runtime_env is left out on purpose: it may carry --env values.
    typer.echo(f"submission_id: {submission_id}")
    typer.echo(f"status:        {info.status.value}")
    typer.echo(f"entrypoint:    {info.entrypoint}")
    typer.echo(f"started:       {_fmt_ms(info.start_time)}")
    typer.echo(f"ended:         {_fmt_ms(info.end_time)}")
    if info.driver_exit_code is not None:
        typer.echo(f"exit code:     {info.driver_exit_code}")
    if info.message:
        typer.echo(f"message:       {info.message.splitlines()[0]}")


def logs(
    submission_id: Annotated[str, typer.Argument(help="Submission id.")],
    address: AddressOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
) -> None:
    """Print a job's driver logs; with --follow, stream them and exit with the job's status."""
    client = _client(address)
    if _existing_status(client, submission_id) is None:
        typer.echo(f"error: no job {submission_id!r} on {without_userinfo(address or '')}", err=True)
        raise typer.Exit(1)
    if follow:
        raise typer.Exit(_follow_and_exit_code(client, submission_id))
    typer.echo(client.get_job_logs(submission_id), nl=False)


def stop(
    submission_id: Annotated[str, typer.Argument(help="Submission id (see `longdoc status`).")],
    address: AddressOpt = None,
    wait_s: Annotated[float, typer.Option("--wait-s", min=0, help="Wait this long for the job to end.")] = 90.0,
) -> None:
    """Stop a submitted job: its run records itself as interrupted and keeps its staged rows
    (submit the date again with --suffix to finish it). Exit 1 if the id is unknown or the
    job has not ended after --wait-s seconds."""
    import time

    client = _client(address)
    before = _existing_status(client, submission_id)
    if before is None:
        typer.echo(f"error: no job {submission_id!r} on {without_userinfo(address or '')}", err=True)
        raise typer.Exit(1)
    if before in _ENDED:
        typer.echo(f"job {submission_id} already ended: {before}")
        return
    client.stop_job(submission_id)
    deadline = time.monotonic() + wait_s
    now = before
    while now not in _ENDED and time.monotonic() < deadline:
        time.sleep(1.0)
        now = _existing_status(client, submission_id) or now
    if now not in _ENDED:
        typer.echo(f"error: stop requested for {submission_id}; still {now} after {wait_s:g} s "
                   f"(`longdoc status {submission_id}` shows when it ends)", err=True)
        raise typer.Exit(1)
    typer.echo(f"job {submission_id}: {now} (was {before}); rows it staged are kept: submit the "
               "same spec and --date again with --suffix (e.g. --suffix resume) to publish them and do the rest")
