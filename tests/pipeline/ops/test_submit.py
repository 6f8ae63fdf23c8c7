"""`longdoc submit/status/logs/stop` against a real local Ray head with the Jobs API.

The head runs with Ray token authentication (a per-test token), so the tests also
show that submission works with auth on, that a missing token gives a clear error,
and that neither the token nor a passed-through secret ever appears in our output.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ray_head import VENV_BIN, ray_head
from s3_server import moto_s3

from pipeline.date_lease import DateLease
from pipeline.ops.submit import build_entrypoint, resolve_run_date, submission_id_for

DATE = "2026-02-03"
TOKEN = secrets.token_hex(16)
SECRET = "s3cr3t-" + secrets.token_hex(8)


def test_ids_entrypoint_and_dates():
    assert submission_id_for("nightly", DATE) == f"longdoc-nightly-{DATE}"
    assert submission_id_for("nightly", DATE, "retry1") == f"longdoc-nightly-{DATE}-retry1"
    with pytest.raises(ValueError, match="suffix"):
        submission_id_for("nightly", DATE, "a b")
    ep = build_entrypoint("spec.yaml", DATE, ["task.instruction=Say it; rm -rf /"], "r1", 0.25)
    assert ep == (f"longdoc run spec.yaml --date {DATE} --runner ray --set 'task.instruction=Say it; rm -rf /' "
                  "--run-id r1 --max-failed-fraction 0.25")
    assert resolve_run_date(DATE) == DATE
    assert len(resolve_run_date(None)) == 10
    for bad in ("2026-13-01", "20260101", "yesterday"):
        with pytest.raises(ValueError, match="YYYY-MM-DD"):
            resolve_run_date(bad)


@pytest.fixture(scope="module")
def head():
    with ray_head(num_cpus=8, token=TOKEN) as h:  # logical CPUs: a budget, not cores
        yield h


def _env(token: str | None = TOKEN, aws: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for the child; ``aws``: its AWS_* variables instead of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env["LONGDOC_TEST_SECRET"] = SECRET
    if aws is not None:
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")} | aws
    return env


def longdoc(*args: str, token: str | None = TOKEN, cwd: Path | None = None,
            aws: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process (auth settings stay out of this process)."""
    cmd = [str(VENV_BIN / "longdoc"), *args]
    r = subprocess.run(cmd, env=_env(token, aws), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert TOKEN not in r.stdout + r.stderr and SECRET not in r.stdout + r.stderr
    if store_secret := (aws or {}).get("AWS_SECRET_ACCESS_KEY"):  # the object store's secret stays unsaid too
        assert store_secret not in r.stdout + r.stderr
    return r


def _job_spec(tmp_path: Path, model_dir: Path) -> Path:
    """A spec whose corpus is a *relative* path: it resolves only where the folder is shipped."""
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    for i, topic in enumerate(["rivers", "bridges", "lakes"]):
        (corpus / f"{topic}.txt").write_text(f"Document {i} is about {topic}. " * 20)
    spec = {
        "name": "tinyjob",
        "input": {"uri": "corpus", "format": "text"},
        "generation": {"model": "embedded:smollm2-135m-instruct", "max_new_tokens": 4},
        "resources": {"batch_size": 2, "num_cpus": 1},
        "output": {"uri": str(tmp_path / "out" / "{job}")},
    }
    path = tmp_path / "tinyjob.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow  # a real head with the Jobs API, a job submitted, waited for, resubmitted: ~2 min
def test_submit_wait_duplicate_status_logs(head, tmp_path, tiny_model_dir):
    spec = _job_spec(tmp_path, tiny_model_dir)
    common = ["--address", head.dashboard_url, "--date", DATE, "--set", f"generation.model={tiny_model_dir}"]
    # Ship the folder (spec + corpus) and this checkout's packages with the job.
    r = longdoc("submit", str(spec), *common, "--wait", "--env", "LONGDOC_TEST_SECRET",
                "--working-dir", str(tmp_path), "--ship-code")
    assert r.returncode == 0, r.stdout + r.stderr
    sid = f"longdoc-tinyjob-{DATE}"
    assert f"submitted {sid}" in r.stdout and "SUCCEEDED" in r.stdout
    assert "entrypoint: python -m pipeline.cli run tinyjob.yaml" in r.stdout
    assert "env vars passed (values not shown): LONGDOC_TEST_SECRET" in r.stdout
    assert "note: Ray keeps --env values in the job's runtime environment (LONGDOC_TEST_SECRET)" in r.stderr
    out_dir = tmp_path / "out" / "tinyjob" / f"run_date={DATE}"
    table = pq.read_table(out_dir)
    assert table.num_rows == 3
    assert len(set(table.column("request_id").to_pylist())) == 3
    assert table.column("error").null_count == 3
    assert set(table.column("model").to_pylist()) == {str(tiny_model_dir)}  # --set reached the job

    # The named variable (and only it) travelled in the runtime_env.
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.dashboard_url, headers={"Authorization": f"Bearer {TOKEN}"})
    info = client.get_job_info(sid)
    # (and the time Ray leaves a stopped driver to record its run: pipeline/ops/submit.py)
    assert info.runtime_env["env_vars"] == {"LONGDOC_TEST_SECRET": SECRET, "RAY_JOB_STOP_WAIT_TIME_S": "60"}
    assert len(info.runtime_env["py_modules"]) == 3  # pipeline, stages, schemas
    assert info.metadata == {"longdoc.job": "tinyjob", "longdoc.run_date": DATE}

    # The same nightly job and date is refused.
    r = longdoc("submit", str(spec), *common, "--working-dir", str(tmp_path))
    assert r.returncode == 1 and f"job {sid} was already submitted (status SUCCEEDED)" in r.stderr
    # Without --working-dir only the spec travels: its relative corpus path is refused here.
    r = longdoc("submit", str(spec), *common, "--suffix", "retry1", "--wait")
    assert r.returncode == 2 and "input.uri: 'corpus' is a relative path, and only the spec travels" in r.stderr
    # A deliberate resubmission takes --suffix. An absolute path the cluster lacks: the job
    # fails there and --wait exits non-zero.
    gone = str(tmp_path / "gone")
    r = longdoc("submit", str(spec), *common, "--suffix", "retry1", "--wait", "--set", f"input.uri={gone}")
    assert r.returncode != 0 and f"job {sid}-retry1 finished: FAILED" in r.stdout, r.stdout + r.stderr
    assert "entrypoint: longdoc run tinyjob.yaml" in r.stdout
    assert f"note: input.uri={gone!r} is a local path" in r.stderr
    assert f"input.uri: {gone!r} does not exist" in r.stderr  # the job's own error, not Ray's heading alone
    assert pq.read_table(out_dir).num_rows == 3

    r = longdoc("status", sid, "--address", head.dashboard_url)
    assert r.returncode == 0 and "SUCCEEDED" in r.stdout and f"--date {DATE}" in r.stdout
    r = longdoc("status", "--address", head.dashboard_url)
    assert sid in r.stdout and f"{sid}-retry1" in r.stdout
    r = longdoc("logs", sid, "--address", head.dashboard_url)
    assert r.returncode == 0 and "longdoc: run" in r.stdout
    r = longdoc("status", "no-such-job", "--address", head.dashboard_url)
    assert r.returncode == 1 and "no job 'no-such-job'" in r.stderr


@pytest.mark.slow  # a job submitted and stopped mid-run on the real head: ~1 min
def test_stop_ends_a_running_job_which_records_itself_as_interrupted(head, tmp_path, tiny_model_dir, monkeypatch):
    import json
    import re
    import time

    spec = _job_spec(tmp_path, tiny_model_dir)
    corpus = tmp_path / "corpus"
    for i in range(40):  # long enough to be stopped mid-run: one slot, many tokens per row
        (corpus / f"more{i}.txt").write_text(f"Extra document {i} about canals. " * 30)
    data = yaml.safe_load(spec.read_text())
    data["generation"]["max_new_tokens"] = 256
    data["resources"]["decode_slots"] = 1
    spec.write_text(yaml.safe_dump(data))
    common = ["--address", head.dashboard_url, "--date", DATE, "--set", f"generation.model={tiny_model_dir}"]
    monkeypatch.setenv("LONGDOC_PROGRESS_INTERVAL_S", "0.5")  # the job's line, every half second
    r = longdoc("submit", str(spec), *common, "--suffix", "tostop", "--working-dir", str(tmp_path), "--ship-code",
                "--env", "LONGDOC_PROGRESS_INTERVAL_S")
    assert r.returncode == 0, r.stdout + r.stderr
    sid = f"longdoc-tinyjob-{DATE}-tostop"
    t0 = time.time()
    # Stopped once its engine works: the line shows the engine's counts, which the generate actor
    # posts to the run's board, found by name from the driver the Jobs API started
    # (pipeline/engine_board.py; the job's namespace, as `longdoc run --address`'s).
    while not re.search(r"\| (?:engine|\d+ engines): \d+ decoding",
                        logs := longdoc("logs", sid, "--address", head.dashboard_url).stdout):
        assert time.time() - t0 < 180, logs
        time.sleep(1)
    r = longdoc("stop", sid, "--address", head.dashboard_url)
    assert r.returncode == 0 and f"job {sid}: STOPPED" in r.stdout and "--suffix" in r.stdout, r.stdout + r.stderr
    run_id = logs.split("longdoc: run ", 1)[1].split()[0]
    record = json.loads((tmp_path / "out" / "tinyjob.runs" / DATE / f"{run_id}.json").read_text())
    assert record["summary"]["status"] == "interrupted" and record["summary"]["interrupted_by"] == "SIGTERM"
    r = longdoc("stop", sid, "--address", head.dashboard_url)
    assert r.returncode == 0 and "already ended: STOPPED" in r.stdout
    r = longdoc("stop", "no-such-job", "--address", head.dashboard_url)
    assert r.returncode == 1 and "no job 'no-such-job'" in r.stderr


def test_cli_errors(head, tmp_path, tiny_model_dir):
    spec = _job_spec(tmp_path, tiny_model_dir)
    # Without the cluster's token: a clear message, exit 1, nothing submitted.
    r = longdoc("submit", str(spec), "--address", head.dashboard_url, "--working-dir", str(tmp_path), token=None)
    assert r.returncode == 1 and "RAY_AUTH_TOKEN" in r.stderr
    # A relative output would be written into Ray's temporary copy of the upload: refused.
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--working-dir", str(tmp_path),
                "--set", "output.uri=out/{job}")
    assert r.returncode == 2 and "output.uri: 'out/{job}' is a relative path" in r.stderr
    # A bad override fails locally (exit 2) before any cluster is contacted.
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--set", "resources.actors=0")
    assert r.returncode == 2 and "resources.actors" in r.stderr
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--working-dir", str(tmp_path),
                "--env", "NOT_SET_ANYWHERE_X")
    assert r.returncode == 2 and "NOT_SET_ANYWHERE_X" in r.stderr
    r = longdoc("status", "--address", "http://127.0.0.1:9")
    assert r.returncode == 1 and "cannot reach" in r.stderr


def test_submit_of_a_date_a_run_writes_now_is_refused_before_the_cluster_is_asked(tmp_path, tiny_model_dir):
    """`submit --suffix retry1` while the first job still runs: its driver would exit 75 on
    the cluster; said here first (the address is a closed port: never contacted)."""
    spec = _job_spec(tmp_path, tiny_model_dir)
    root = str(tmp_path / "out" / "tinyjob")
    lease = DateLease(root, DATE, "first-job", "tinyjob")  # this test's process: alive
    lease.acquire()
    try:
        r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--working-dir", str(tmp_path),
                    "--date", DATE, "--suffix", "retry1")
    finally:
        lease.release()
    assert r.returncode == 75 and "run first-job" in r.stderr and "one run of a date at a time" in r.stderr, r.stderr


def test_files_that_hold_credentials_are_never_uploaded_with_the_working_dir(tmp_path):
    """A review's `submit --working-dir` uploaded `.env`, `id.pem` and `.aws/credentials` to
    the cluster, where anyone with the dashboard reads the package. Ray's own matcher, over
    the excludes submit hands it."""
    from ray._private.runtime_env.packaging import _get_excludes

    from pipeline.ops.submit import WORKING_DIR_EXCLUDES

    for name in ("s3.yaml", "docs/in.jsonl", ".env", ".env.prod", "id.pem", "tls.key", ".aws/credentials",
                 ".ssh/id_ed25519", "id_rsa", ".netrc", ".git-credentials", ".kube/config", "out/x/run.parquet",
                 ".s3cfg", "gcp/service-account-prod.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    excluded = _get_excludes(tmp_path, WORKING_DIR_EXCLUDES)
    kept = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
                  if p.is_file() and not any(excluded(q) for q in (p, *p.parents) if tmp_path in q.parents))
    assert kept == ["docs/in.jsonl", "s3.yaml"], kept


def test_an_address_with_credentials_is_shown_without_them(tmp_path):
    """`--address http://user:pass@HOST` printed the password in its error."""
    r = longdoc("status", "--address", "http://rayuser:RayPassFAKE01@127.0.0.1:9")
    assert r.returncode == 1 and "cannot reach the Ray Jobs API at http://***@127.0.0.1:9" in r.stderr, r.stderr
    assert "RayPassFAKE01" not in r.stderr + r.stdout


# ----------------------------------------------------------------------------- the input, checked here
@pytest.fixture(scope="module")
def s3():
    """The S3-compatible server on loopback (tests/s3_server.py), with one night's folder."""
    with moto_s3() as server:
        fs = server.filesystem()
        fs.mkdir("submit-docs")  # a bucket of its own: moto keeps other tests' buckets in this process
        fs.pipe(f"submit-docs/nightly/{DATE}/a.jsonl", b'{"id": "a", "text": "A short document."}\n')
        fs.pipe("submit-docs/nightly/2026-02-01/empty.jsonl", b"")  # an upstream job that wrote nothing
        yield server


def _no_credentials(tmp_path: Path, endpoint: str) -> dict[str, str]:
    """The AWS variables of a machine with no credentials anywhere (files, instance metadata)."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"), "AWS_EC2_METADATA_DISABLED": "true"}


def _s3_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "nightly.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "nightly", "input": {"uri": "s3://submit-docs/nightly/{run_date}/", "format": "jsonl"},
        "generation": {"model": "embedded:smollm2-135m-instruct", "max_new_tokens": 4},
        "output": {"uri": str(tmp_path / "out" / "{job}")}}))
    return spec


@pytest.fixture
def cluster_port():
    """A port where a cluster would be: it counts who connects and hangs up on them at once (a
    submission that got this far fails fast instead of waiting on an answer)."""
    import socket
    import threading

    accepted: list[int] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed at the fixture's end
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", lambda: bool(accepted)
    finally:
        sock.close()


def test_a_missing_or_empty_s3_input_is_refused_before_the_cluster_is_asked(s3, tmp_path, cluster_port):
    """A night folder that has not arrived, or holds only empty files, was found on the cluster,
    after the job (with KubeRay's render, a cluster) started: refused here, with validate's own
    line and exit code, and the cluster never contacted."""
    address, contacted = cluster_port
    spec = _s3_spec(tmp_path)
    for date, said in (("2026-02-02", "nothing is under this prefix"), ("2026-02-01", "are all empty")):
        r = longdoc("submit", str(spec), "--address", address, "--date", date, aws=s3.env())
        v = longdoc("validate", str(spec), "--date", date, aws=s3.env())
        assert r.returncode == v.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == v.stderr.strip(), (r.stderr, v.stderr)  # the same one line
        assert r.stderr.startswith("error: input.uri") and f"nightly/{date}/" in r.stderr and said in r.stderr
        assert not contacted() and "submitted" not in r.stdout
    # --skip-storage leaves the check to the cluster, as validate's does: the cluster is asked.
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--date", "2026-02-02", "--skip-storage",
                aws=s3.env())
    assert r.returncode == 1 and "cannot reach the Ray Jobs API" in r.stderr and "input.uri" not in r.stderr


def test_an_s3_input_this_machine_has_no_credentials_for_is_a_note(s3, tmp_path):
    """The cluster may hold credentials this machine lacks: one note, and the submission goes on
    (here to a closed port, so it ends at the cluster's door)."""
    spec = _s3_spec(tmp_path)
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--date", "2026-02-02",
                aws=_no_credentials(tmp_path, s3.endpoint_url))
    notes = [line for line in r.stderr.splitlines() if "input.uri" in line]
    assert notes == ["note: input.uri 's3://submit-docs/nightly/2026-02-02/' not checked: no credentials for the "
                     "object store on this machine; the cluster reads it with its own credentials (--skip-storage "
                     "skips this check)"], r.stderr
    assert r.returncode == 1 and "cannot reach the Ray Jobs API at http://127.0.0.1:9" in r.stderr, r.stderr


def test_a_good_s3_input_passes_the_check(s3, tmp_path):
    """The control: the night's folder is there, so submit goes on to the cluster (a closed port)."""
    spec = _s3_spec(tmp_path)
    r = longdoc("submit", str(spec), "--address", "http://127.0.0.1:9", "--date", DATE, aws=s3.env())
    assert r.returncode == 1 and "cannot reach the Ray Jobs API at http://127.0.0.1:9" in r.stderr, r.stderr
    assert "input.uri" not in r.stderr, r.stderr


def test_an_s3_input_without_s3fs_here_is_left_to_the_cluster(tmp_path, monkeypatch):
    """Where s3fs is not installed the input cannot be listed here, and only the cluster image
    needs it (submit's note on the package says so): no refusal of a storage failure."""
    import sys

    from pipeline.ops.submit import input_check
    from schemas.loading import load_spec

    monkeypatch.setitem(sys.modules, "s3fs", None)  # Python's own "this import fails" marker
    job = load_spec(_s3_spec(tmp_path), [])
    assert input_check(job, DATE) == ([], [])


def test_a_memory_input_is_not_listed_from_the_submitting_machine(tmp_path):
    """``memory://`` is one process's filesystem: the submitting process cannot see what the
    cluster's would hold, so its input is not checked here (not refused as missing)."""
    from pipeline.ops.submit import input_check
    from schemas.loading import spec_from_dict

    job = spec_from_dict({"name": "mem", "input": {"uri": "memory://submit-nowhere/{run_date}/", "format": "jsonl"},
                          "generation": {"model": "embedded:smollm2-135m-instruct"},
                          "output": {"uri": str(tmp_path / "out" / "{job}")}})
    assert input_check(job, DATE) == ([], [])


def test_a_home_path_is_not_relative_and_a_relative_one_is_refused_with_the_fix():
    """``~`` is every node's home folder (a shared home mount), not Ray's copy of the upload."""
    from pipeline.ops.submit import relative_path_problems

    assert relative_path_problems("~/corpus", "~/out/{job}", shipped=False) == []
    assert relative_path_problems("file:///data/in", "s3://b/out", shipped=False) == []
    inp, out = relative_path_problems("corpus", "out/{job}", shipped=False)
    assert inp.startswith("input.uri: 'corpus' is a relative path") and "--working-dir" in inp
    assert out.startswith("output.uri: 'out/{job}' is a relative path")
    assert relative_path_problems("corpus", "/data/out", shipped=True) == []


def test_a_store_this_machine_cannot_reach_is_refused_naming_skip_storage(s3, tmp_path):
    """An endpoint only the cluster resolves (an in-cluster MinIO), another role's profile or an
    expired token: refused as validate refuses it, with the way round for a store only the
    cluster reaches."""
    env = {**s3.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    r = longdoc("submit", str(_s3_spec(tmp_path)), "--address", "http://127.0.0.1:9", "--date", DATE, aws=env)
    assert r.returncode == 2 and "cannot reach the object store at http://127.0.0.1:9" in r.stderr, r.stderr
    assert "or --skip-storage if only the cluster reaches the store" in r.stderr, r.stderr
