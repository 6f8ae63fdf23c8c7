"""A node lost mid-run on a real two-node Ray cluster: every request exactly once, 0 errors.

The cluster is two raylets on this machine: a head (GCS, dashboard, Jobs API; it runs
the driver, reads, tokenizes and writes) and a worker node joined with
``ray start --address`` that alone offers the custom resource ``gen_node``; the spec
asks for it (``resources.custom_resources``), so the generate actors run only there.
Mid-run, while the driver is frozen (SIGSTOP, so the run cannot finish behind the
kill's back), the worker node's raylet is SIGKILLed (a preempted spot node); once the
GCS has marked the node dead, a new worker node joins. The run either finishes on it
(Ray restarts the actor there and retries its batches) or aborts with retryable rows
that one rerun heals. Either way: every request exactly once, 0 errors, the run
summary's counts equal to the files. The same again through `longdoc submit` to the
cluster's Jobs API. Every wait is for an event (a staged file, an actor or node state).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ray_head import FAST_NODE_DEATH, VENV_BIN, kill_raylet, ray_head, ray_worker

from stages.layout import run_record_dir, runs_root

pytestmark = pytest.mark.slow  # two clusters' worth of nodes and three runs: minutes

N_DOCS = 24
GENERATE = "MapWorker(MapBatches(GenerateStage))"
NODE = {"gen_node": 1}


@pytest.fixture(scope="module")
def head():
    with ray_head(num_cpus=4, env=FAST_NODE_DEATH) as h:
        yield h


def _staging(out: Path) -> Path:
    """Staged blocks of every date: beside the output root (stages/layout.py ``runs_root``)."""
    return Path(runs_root(str(out))) / "_staging"


def _spec(tmp_path: Path, model_dir: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(N_DOCS):
        (corpus / f"doc{i:02d}.txt").write_text(f"Site {i} lies on river {i * 5 % 11} near the hills. " * 10)
    spec = tmp_path / "nodes.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "nodes",
        "input": {"uri": str(corpus)},
        # One row decodes at a time, without drafts, 64 tokens: blocks are staged one after
        # another for seconds. With the default slots every row decodes together and all 24
        # are written within about a second of the first (CI once missed that window).
        "generation": {"model": str(model_dir), "max_new_tokens": 64, "speculative": {"method": "none"}},
        "resources": {"batch_size": 2, "num_cpus": 1, "custom_resources": NODE, "schedule_timeout_s": 300,
                      "decode_slots": 1},
        "output": {"uri": str(tmp_path / "out")},
    }))
    return spec


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def _rows(out: Path, date: str) -> list[dict]:
    files = sorted((out / f"run_date={date}").glob("*.parquet")) + sorted(_staging(out).rglob("*.staged"))
    cols = ["request_id", "error", "error_kind"]
    return [r for f in files for r in pq.read_table(f, columns=cols).to_pylist()]


def _summary(out: Path, date: str) -> dict:
    (path,) = sorted(Path(run_record_dir(str(out), date)).glob("*.json"), key=lambda p: p.stat().st_mtime)[-1:]
    return json.loads(path.read_text())["summary"]


def _generate_actors(head) -> list:
    from ray.util.state import list_actors

    try:
        actors = list_actors(address=head.dashboard_url, detail=True, limit=1000)
    except Exception:  # noqa: BLE001 - the dashboard drops a request while a node dies: look again
        return []
    return [a for a in actors if a.class_name == GENERATE]


def _node_state(head, node_id: str) -> str:
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(address=head.dashboard_url, limit=100)
    except Exception:  # noqa: BLE001 - as above
        return "UNKNOWN"
    return next((n.state for n in nodes if n.node_id == node_id), "GONE")


def _lose_the_node(head, worker, out: Path, freeze_pid, done: threading.Event, report: dict) -> None:
    """Thread: when a block is staged, freeze the driver, and if a generate actor is alive
    on ``worker``'s node, SIGKILL the node's raylet and let the driver go on; then wait
    until the GCS has marked the node dead (events: a file, an actor state, a node state).

    The staged file is looked for every 50 ms and the driver frozen at once, before the
    dashboard queries (up to a second or two each on a busy machine): a run can write
    its remaining blocks within a second of its first, and a poll that queries first
    may look only after the run has ended."""
    tick = threading.Event()
    seen = {a.actor_id for a in _generate_actors(head) if a.state == "DEAD"}
    pid = None
    while not done.is_set():
        pid = pid or freeze_pid()  # a run's driver keeps its pid: ask the Jobs API until it answers
        staged = bool(list(_staging(out).rglob("*.staged")))
        report["last_poll"] = {"driver_pid": pid, "block_staged": staged}  # for a timing miss's message
        if not (pid and staged):
            tick.wait(0.05)
            continue
        os.kill(pid, signal.SIGSTOP)  # the run cannot finish behind the kill's back from here on
        try:
            for _ in range(20):  # the dashboard may drop a query on a busy machine: ask again
                on_node = [a for a in _generate_actors(head) if a.state == "ALIVE" and a.actor_id not in seen]
                if on_node:
                    break
                tick.wait(0.5)
            report["last_poll"]["generate_actors_alive"] = len(on_node)
            if not on_node:
                return  # the actors are gone already: the run is ending; the caller reports the miss
            node_id = on_node[0].node_id
            kill_raylet(worker)
            report["rows_at_kill"] = sum(r["error"] is None for r in _rows(out, report["date"]))
        finally:
            os.kill(pid, signal.SIGCONT)
        while _node_state(head, node_id) in ("ALIVE", "UNKNOWN"):
            tick.wait(0.2)
        report["node_dead"] = True
        return


def _abort_line(output: str) -> str:
    return next((ln for ln in output.splitlines() if "run aborted" in ln), "?")[:300]


def _check_exactly_once(out: Path, date: str) -> dict:
    rows = _rows(out, date)
    ids = [r["request_id"] for r in rows]
    assert len(ids) == N_DOCS and len(set(ids)) == N_DOCS, "each request exactly once"
    assert [r for r in rows if r["error"] is not None] == [], "0 errors"
    assert not list(_staging(out).rglob("*.staged"))
    s = _summary(out, date)
    assert s["status"] == "succeeded" and s["date_rows"] == N_DOCS and s["date_failed"] == 0
    assert pq.read_table(out / f"run_date={date}").num_rows == s["date_rows"]  # the summary = the files
    return s


def _run_losing_a_node(head, start, freeze_pid, out: Path, date: str, worker_cm) -> tuple[int, str, dict]:
    """Start a run against the cluster, lose its worker node mid-run, join a new one."""
    report: dict = {"date": date}
    done = threading.Event()
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(worker_cm())
        proc = start()
        killer = threading.Thread(target=_lose_the_node, args=(head, worker, out, lambda: freeze_pid(proc), done, report))
        killer.start()
        try:
            while killer.is_alive() and proc.poll() is None:
                killer.join(timeout=0.5)  # event: the node is dead, or the run ended (aborted)
            if "rows_at_kill" not in report:
                tail = proc.communicate(timeout=60)[0][-3000:] if proc.poll() is not None else ""
                raise AssertionError(f"the run ended (rc {proc.returncode}) before the node could be lost; the "
                                     f"killer's last poll {report.get('last_poll')}; the run's output ends:\n{tail}")
            assert report["rows_at_kill"] < N_DOCS
            if proc.poll() is None:
                stack.enter_context(worker_cm())  # a replacement node joins the running job
            output, _ = proc.communicate(timeout=900)
        finally:
            done.set()
            killer.join(timeout=30)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output, report


def test_a_lost_worker_node_costs_no_request(head, tmp_path, tiny_model_dir):
    spec = _spec(tmp_path, tiny_model_dir)
    out = tmp_path / "out"

    def worker_cm():
        return ray_worker(head, num_cpus=1, resources=NODE)

    # 1. `longdoc run --address` (the driver on this machine, as on a cluster's head).
    date = "2026-07-01"
    cmd = [str(VENV_BIN / "longdoc"), "run", str(spec), "--address", head.gcs_address, "--date", date]

    def start():
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)

    t0 = time.monotonic()
    rc, output, report = _run_losing_a_node(head, start, lambda p: p.pid, out, date, worker_cm)
    first = f"exit {rc}" + ("" if rc == 0 else f" ({_abort_line(output)}), rerun exit 0")
    if rc != 0:  # Ray gave up: retryable rows for everything unfinished, and one rerun heals
        assert rc == 1 and "run aborted" in output, output[-4000:]
        rows = _rows(out, date)
        assert len({r["request_id"] for r in rows}) == len(rows) == N_DOCS
        assert {r["error_kind"] for r in rows if r["error"]} <= {"retryable"}
        with ray_worker(head, num_cpus=1, resources=NODE):
            again = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    else:
        assert "run aborted" not in output
    s = _check_exactly_once(out, date)
    restarts = max((a.num_restarts for a in _generate_actors(head)), default=0)
    print(f"\nnode loss via run: {first}, {report['rows_at_kill']} rows written when the node was lost, "
          f"actor restarts {restarts}, {time.monotonic() - t0:.0f}s; final rows {s['date_rows']}, errors 0")

    # 2. The same through `longdoc submit` to the cluster's Jobs API (the driver runs on the head).
    date2 = "2026-07-02"
    sub = [str(VENV_BIN / "longdoc"), "submit", str(spec), "--address", head.dashboard_url, "--date", date2, "--wait"]

    def start_submit():
        return subprocess.Popen(sub, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)

    def job_driver_pid(_proc) -> int | None:
        from ray.job_submission import JobSubmissionClient

        try:
            info = JobSubmissionClient(head.dashboard_url).get_job_info(f"longdoc-nodes-{date2}")
        except RuntimeError:
            return None  # not submitted yet
        return (info.driver_info.pid and int(info.driver_info.pid)) if info.driver_info else None

    t0 = time.monotonic()
    rc, output, report = _run_losing_a_node(head, start_submit, job_driver_pid, out, date2, worker_cm)
    if rc != 0:
        assert "run aborted" in output, output[-4000:]
        with ray_worker(head, num_cpus=1, resources=NODE):
            again = subprocess.run([*sub, "--suffix", "rerun"], env=_env(), capture_output=True, text=True,
                                   timeout=900)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    s = _check_exactly_once(out, date2)
    second = f"exit {rc}" + ("" if rc == 0 else f" ({_abort_line(output)}), rerun exit 0")
    print(f"node loss via submit: {second}, {report['rows_at_kill']} rows written when the node was lost, "
          f"{time.monotonic() - t0:.0f}s; final rows {s['date_rows']}, errors 0")
