"""What a cluster cannot give: memory an actor needs, a resource no node has.

- Out of memory: a worker node whose Ray workers may hold only 2000 MB of private memory
  (RLIMIT_DATA, set from outside the product at each worker's start: tests/worker_limits) hosts the
  generate actors (custom resource ``oom_node``); the model (Llama-3.2-1B's shape, random
  weights: 5 GB in fp32) does not fit there, so the actor's allocation fails for real. The run ends
  (no hang), every request has exactly one row, retryable, naming the failure.
- Unschedulable on a cluster: a pool asking for a resource no node offers fails after
  ``resources.schedule_timeout_s`` with a message naming the resource and what the
  nodes have; its requests are retryable rows.
- Unschedulable on the embedded Ray (this machine, nothing will be added): refused at
  once, exit 2, nothing written.
- A cluster node of the pools' own size (2 CPUs: generate 1 + tokenize 0.5): the read,
  expansion and write tasks fit beside them (they asked 1 CPU each and waited for ever).
- Two raylets (the head and a worker node), one generate actor on each: the progress line
  shows the engines' rows before the first row is written and sums both nodes' engines
  ("2 engines: ...", pipeline/engine_board.py); the run leaves no actor of its own (the
  board included) behind.
- The embedded Ray beside a cluster a user started on this machine (`ray start`): a run
  without --address starts its own instead of attaching to that one (which refused the
  embedded Ray's CPU count).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from ray_head import VENV_BIN, log_tails, ray_head, ray_worker
from worker_limits import job_config_env

from stages.layout import run_record_dir

DATE = "2026-08-01"
N_DOCS = 6
# Above what a Ray worker holds with torch and a tiny model loaded (~1.75 GB of private
# memory, measured), far below a 1B-parameter model in fp32 (~5 GB).
WORKER_DATA_MB = 2000


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    env.update(extra)
    return env


def _spec(tmp_path: Path, name: str, model: str, resources: dict) -> Path:
    corpus = tmp_path / f"corpus-{name}"
    corpus.mkdir()
    for i in range(N_DOCS):
        (corpus / f"d{i}.txt").write_text(f"Document {i} is about the river {i}. " * 15)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name,
        "input": {"uri": str(corpus)},
        "generation": {"model": model, "max_new_tokens": 8},
        "resources": {"batch_size": 2, "num_cpus": 1, **resources},
        "output": {"uri": str(tmp_path / f"out-{name}")},
    }))
    return spec


def _rows(out: Path) -> list[dict]:
    cols = ["request_id", "error", "error_kind"]
    return [r for f in sorted((out / f"run_date={DATE}").glob("*.parquet"))
            for r in pq.read_table(f, columns=cols).to_pylist()]


def _summary(out: Path) -> dict:
    (path,) = Path(run_record_dir(str(out), DATE)).glob("*.json")
    return json.loads(path.read_text())["summary"]


@pytest.mark.slow
def test_a_two_cpu_node_runs_the_default_plan_to_the_end(tmp_path):
    """Defined before the tests sharing the module's head, so it runs while no other Ray
    cluster is up on this machine: one CI run saw its driver fail to register with the
    raylet (one line from Ray's C++, exit 1) while the module's 3-CPU head was still up."""
    spec = _spec(tmp_path, "small", "random:tiny", {"custom_resources": {}})
    data = yaml.safe_load(spec.read_text())
    del data["resources"]["num_cpus"]  # auto: 1 per actor on a cluster
    spec.write_text(yaml.safe_dump(data))
    with ray_head(num_cpus=2) as h:
        r = subprocess.run([str(VENV_BIN / "longdoc"), "run", str(spec), "--date", DATE, "--quiet",
                            "--address", h.gcs_address], env=_env(), capture_output=True, text=True, timeout=240)
        logs = "" if r.returncode == 0 else log_tails(h.temp_dir)  # read before the head's folder goes
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:] + "\n" + logs
    assert len(_rows(tmp_path / "out-small")) == N_DOCS


#: A resource each node of the two-raylet test offers once: its generate pool (2 actors asking
#: one each) then has one actor on the head and one on the worker node.
GEN_SLOT = {"gen_slot": 1}


@pytest.fixture(scope="module")
def head():
    with ray_head(num_cpus=3, resources=GEN_SLOT) as h:
        yield h


@pytest.mark.slow
def test_an_actor_out_of_memory_gives_retryable_rows_and_the_run_ends(head, tmp_path):
    spec = _spec(tmp_path, "oom", "random:llama-1b",
                 {"custom_resources": {"oom_node": 1}, "schedule_timeout_s": 300})
    with ray_worker(head, num_cpus=1, resources={"oom_node": 1}) as node:
        t = time.monotonic()
        r = subprocess.run([str(VENV_BIN / "longdoc"), "run", str(spec), "--address", head.gcs_address,
                            "--date", DATE], env=_env(**job_config_env(WORKER_DATA_MB, node.temp_dir)),
                           capture_output=True, text=True, timeout=900)  # the bound is the hang check
    took = time.monotonic() - t
    out = tmp_path / "out-oom"
    assert r.returncode == 1 and "run aborted" in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
    rows = _rows(out)
    assert len(rows) == N_DOCS and len({x["request_id"] for x in rows}) == N_DOCS
    assert {x["error_kind"] for x in rows} == {"retryable"}
    assert all("allocate memory" in x["error"] or "MemoryError" in x["error"] for x in rows), rows[0]["error"]
    s = _summary(out)
    assert s["status"] == "failed" and s["date_rows"] == N_DOCS == s["date_errors_by_kind"]["retryable"]
    print(f"\nout of memory: run ended after {took:.0f}s with {N_DOCS} retryable rows: {rows[0]['error'][:200]}")


@pytest.mark.slow
def test_a_pool_no_node_can_take_fails_within_the_bound_naming_the_resource(head, tmp_path):
    spec = _spec(tmp_path, "nogpu", "random:tiny", {"num_gpus": 0.5, "schedule_timeout_s": 10})
    t = time.monotonic()
    r = subprocess.run([str(VENV_BIN / "longdoc"), "run", str(spec), "--address", head.gcs_address,
                        "--date", DATE], env=_env(), capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    msg = r.stderr
    assert "PoolUnschedulable" in msg and "missing on every node: GPU 0.5" in msg, msg[-3000:]
    assert "resources.schedule_timeout_s" in msg and "CPU 3" in msg  # what the cluster has
    rows = _rows(tmp_path / "out-nogpu")
    assert len(rows) == N_DOCS and {x["error_kind"] for x in rows} == {"retryable"}
    print(f"\nunschedulable: run ended after {took:.0f}s (schedule_timeout_s 10): "
          f"{next(ln for ln in msg.splitlines() if 'PoolUnschedulable' in ln)[:300]}")


def _run_actors(head, namespace_of: str) -> list:
    """The actors (any state) in the Ray namespace of the one actor named ``namespace_of...``:
    the actors of that run's driver."""
    from ray.util.state import list_actors

    actors = list_actors(address=head.dashboard_url, detail=True, limit=1000)
    (ns,) = {a.ray_namespace for a in actors if (a.name or "").startswith(namespace_of)}
    return [a for a in actors if a.ray_namespace == ns]


@pytest.mark.slow
def test_two_raylets_engines_are_summed_on_the_line_and_leave_nothing_behind(head, tmp_path, tiny_model_dir):
    """The generate actors post to the run's board by its name (pipeline/engine_board.py) from
    two nodes; the driver is `longdoc run --address` (a namespace of its own, anonymous)."""
    n = 64
    corpus = tmp_path / "corpus-two"
    corpus.mkdir()
    for i in range(n):
        (corpus / f"d{i:02d}.txt").write_text(f"Document {i} is about the tide. " * 40)
    spec = tmp_path / "two.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "two", "input": {"uri": str(corpus)},
        # Batches of 16 rows decoded one at a time (256 tokens each): seconds of decoding before
        # an actor's first row is written, which the line (up to ~3 s behind the engines:
        # pipeline/engine_board.py) needs to see. Ray Data gives an actor work as soon as it is
        # up, not once the pool is: 64 rows keep the run going while the later actor loads.
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 256},
        "resources": {"actors": 2, "batch_size": 16, "decode_slots": 1, "num_cpus": 1,
                      "custom_resources": GEN_SLOT},
        "output": {"uri": str(tmp_path / "out-two")},
    }))
    # The worker node's 2 CPUs: its generate actor (1) beside a tokenize actor that may land there.
    with ray_worker(head, num_cpus=2, resources=GEN_SLOT):
        r = subprocess.run([str(VENV_BIN / "longdoc"), "run", str(spec), "--date", DATE, "--address",
                            head.gcs_address, "--run-id", "two-raylets"],
                           env=_env(LONGDOC_PROGRESS_INTERVAL_S="0.3"), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:] + "\n" + log_tails(head.temp_dir)
        assert len(_rows(tmp_path / "out-two")) == n
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip().startswith("rows ")]
        # (rows written, engines reporting, rows the engines hold: decoding + queued) per line.
        seen = [(int(m[1]), int(m[2] or 1), int(m[3]) + int(m[4])) for ln in lines if (m := re.search(
            rf"^rows (\d+)/{n} .*\| (?:(\d+) engines|engine): (\d+) decoding \(\d+ tokens\), \d+ prefilling, "
            r"(\d+) queued$", ln))]
        # Before the first row: the engines' counts, with the run's rows in them.
        assert any(rows == 0 and held > 0 for rows, _, held in seen), "\n".join(lines)
        # Both nodes' engines summed: no more rows held than are left to write. (Not required before
        # the first row: an actor may finish its first batch before the other has loaded its model.)
        assert any(k == 2 and 0 < held <= n - rows for rows, k, held in seen), "\n".join(lines)
        # Each node had one generate actor, and once the driver is gone nothing of its run lives
        # on: no board (a named actor), no generate actor (whose thread posted to it).
        deadline = time.monotonic() + 60
        while True:
            actors = _run_actors(head, "longdoc-engine-board-two-raylets-")
            if all(a.state == "DEAD" for a in actors):
                break
            assert time.monotonic() < deadline, [(a.class_name, a.name, a.state) for a in actors]
            time.sleep(0.5)  # the GCS marks a gone driver's actors dead within moments
    generate = [a for a in actors if a.class_name == "MapWorker(MapBatches(GenerateStage))"]
    assert len(generate) == 2 and len({a.node_id for a in generate}) == 2, generate
    assert [a.class_name for a in actors if a.name] == ["EngineBoard"]


@pytest.mark.parametrize("runner", ["ray", "auto"])
def test_one_machine_refuses_a_pool_it_cannot_place_at_once(runner, tmp_path):
    """On the embedded Ray (``--runner ray``) and in one process (``auto`` on one machine
    with one actor: the local runner), a GPU this machine lacks is refused at once, by the
    preflight `validate` shares (before Ray starts). Counting this machine's GPUs imports no
    model stack: the step backends import transformers (seconds of silence before the refusal:
    jobs/results/usability/2026-12-07-night/eta-and-gpu-refusal.md), so where torch sees no accelerator none of them is asked (the import
    log Python writes with PYTHONPROFILEIMPORTTIME names every module the refusal imported)."""
    spec = _spec(tmp_path, "local", "random:tiny", {"custom_resources": {}, "num_gpus": 1})
    said = "resources.num_gpus: 1 GPU(s) asked; this machine has 0; allowed: resources.num_gpus: 0 (on the CPU) here"
    for command in (["run", str(spec), "--date", DATE, "--quiet", "--runner", runner], ["validate", str(spec)]):
        r = subprocess.run([str(VENV_BIN / "longdoc"), *command], env=_env(PYTHONPROFILEIMPORTTIME="1"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
        assert said in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        imported = {ln.rsplit("|", 1)[1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
        assert "torch" in imported and "transformers" not in imported, sorted(imported)[:50]
    assert not (tmp_path / "out-local").exists()  # nothing written


@pytest.mark.slow
def test_the_embedded_ray_is_its_own_beside_a_cluster_started_on_this_machine(head, tmp_path):
    """Ray finds a `ray start` cluster through {RAY_TMPDIR or /tmp}/ray/ray_current_cluster:
    the test's head is made discoverable there (a private folder, so no other session sees it)."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="ldtmp", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text(head.gcs_address)
        spec = _spec(tmp_path, "beside", "random:tiny", {"custom_resources": {}})
        r = subprocess.run([str(VENV_BIN / "longdoc"), "run", str(spec), "--date", DATE, "--quiet", "--runner", "ray"],
                           env=_env(RAY_TMPDIR=str(tmp)), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert len(_rows(tmp_path / "out-beside")) == N_DOCS
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
