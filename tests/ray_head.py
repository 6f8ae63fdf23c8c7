"""A real local Ray cluster for cluster tests: a head (GCS, raylet, dashboard + Jobs API)
and worker nodes (a raylet joined with ``ray start --address``), all on this machine.

Why not ``ray start`` + ``ray stop --force``: ``ray stop`` kills every Ray process on
the machine by name, including other test sessions' clusters. Instead the head runs
as ``ray start --head --block`` in its own session; SIGTERM to that one process makes
Ray drain and stop exactly the processes it spawned. A private ``--temp-dir`` keeps
its address out of /tmp/ray, so a concurrent ``ray.init()`` elsewhere never attaches
to it, and every port is picked free (outside Ray's worker port range). A worker node
(``ray_worker``) is started and stopped the same way, with its own temp dir and ports;
``kill_raylet`` SIGKILLs its raylet, as a lost machine (a preempted spot node) looks to
the rest of the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (from the kernel's ephemeral range, so
    outside Ray's worker port range).

    Every socket stays bound until all are picked: a port released and asked for again at
    once can come back, and `ray start` refuses two components on one port (CI saw the
    dashboard agent and the runtime-env agent both given 50421).
    """
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


@dataclass(frozen=True)
class RayHead:
    gcs_address: str  # for ray.init / `longdoc run --address`
    dashboard_url: str  # for the Jobs API and the state API
    temp_dir: Path
    pid: int


def _wait_http(
    url: str, proc: subprocess.Popen, log: Path, timeout_s: float, token: str | None
) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Ray dashboard not up after {timeout_s}s:\n{log.read_text()[-3000:]}")


@contextmanager
def ray_head(
    num_cpus: int = 2, token: str | None = None, env: dict[str, str] | None = None,
    resources: dict[str, float] | None = None,
) -> Iterator[RayHead]:
    """Start a head with the dashboard on 127.0.0.1; yield it; stop exactly it.

    ``resources``: custom resources of the head node (as ``ray_worker``'s), e.g. one slot of
    a resource each node offers once, so one actor of a pool asking for it lands on each node.

    ``token``: enable Ray token authentication with this token (clients then need
    RAY_AUTH_MODE=token and RAY_AUTH_TOKEN); None disables it explicitly, so the
    result never depends on a stray ~/.ray/auth_token (which Ray would pick up).
    """
    for attempt in range(3):
        try:
            cm = _start_head(num_cpus, token, env, resources)
            head = cm.__enter__()
        except _StartTimedOut:
            if attempt == 2:
                raise
            continue  # Ray gives a raylet 30 s to register (hard-coded); a loaded machine can miss it
        try:
            yield head
        finally:
            cm.__exit__(None, None, None)
        return


class _StartTimedOut(RuntimeError):
    """`ray start` gave up waiting for its raylet to register (a loaded machine)."""


@contextmanager
def _start_head(num_cpus: int, token: str | None, env: dict[str, str] | None,
                resources: dict[str, float] | None = None) -> Iterator[RayHead]:
    # Unix socket paths under the temp dir must stay short (< 108 bytes).
    temp_dir = Path(tempfile.mkdtemp(prefix="ldray", dir="/tmp"))
    gcs_port, dash_port, client_port, agent_port = free_ports(4)
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block",
        f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
        f"--ray-client-server-port={client_port}", f"--dashboard-agent-listen-port={agent_port}",
        f"--num-cpus={num_cpus}", "--object-store-memory=300000000",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        *([f"--resources={json.dumps(resources)}"] if resources else []),
    ]
    full_env = dict(os.environ)
    # Job drivers inherit the raylet's PATH: put this venv's `longdoc` and `python` first.
    full_env["PATH"] = f"{VENV_BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env["RAY_USAGE_STATS_ENABLED"] = "0"
    full_env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # stop at once on SIGTERM (no 30 s drain)
    full_env.pop("RAY_ADDRESS", None)
    full_env.pop("RAY_AUTH_TOKEN", None)
    full_env["RAY_AUTH_MODE"] = "token" if token else "disabled"
    if token:
        full_env["RAY_AUTH_TOKEN"] = token
    full_env.update(env or {})
    log = temp_dir / "head.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
    head = RayHead(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash_port}", temp_dir, proc.pid)
    try:
        try:
            _wait_http(f"{head.dashboard_url}/api/version", proc, log, 120, token)
            # The Jobs API answers only once the head's job agent is registered.
            _wait_http(f"{head.dashboard_url}/api/jobs/", proc, log, 60, token)
        except RuntimeError as e:
            if "timed out during startup" in str(e):
                raise _StartTimedOut(str(e)) from None
            raise
        yield head
    finally:
        _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)  # session logs, sockets, spilled objects


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # Ray drains, then stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # Last resort: the head's own process group (it was started in a new session).
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def log_tails(temp_dir: Path, names: tuple[str, ...] = ("raylet.out", "raylet.err", "gcs_server.err"),
              chars: int = 1500) -> str:
    """The last ``chars`` characters of each named Ray log of the session under ``temp_dir``:
    for an assertion message when a run against a test head fails inside Ray (a driver that
    Ray's C++ ends with one line says nothing of why; the raylet's log does)."""
    parts = []
    for name in names:
        for path in sorted(temp_dir.glob(f"session_*/logs/{name}")):
            text = path.read_text(errors="replace")[-chars:]
            parts.append(f"--- {path.relative_to(temp_dir)}:\n{text}")
    return "\n".join(parts) or f"(no Ray logs under {temp_dir})"


#: Head settings that make a lost node noticed in seconds rather than ~30 s (GCS health
#: checks of each raylet: period x failures); pass as ``ray_head(env=FAST_NODE_DEATH)``.
FAST_NODE_DEATH = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


@dataclass(frozen=True)
class RayWorker:
    temp_dir: Path
    pid: int  # the `ray start --block` process (its session leads the node's processes)
    resources: dict


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    full_env = dict(os.environ)
    full_env["PATH"] = f"{VENV_BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env["RAY_USAGE_STATS_ENABLED"] = "0"
    full_env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    full_env.pop("RAY_ADDRESS", None)
    full_env.pop("RAY_AUTH_TOKEN", None)
    full_env["RAY_AUTH_MODE"] = "disabled"
    full_env.update(extra or {})
    return full_env


def alive_nodes(head: RayHead, timeout_s: float = 120) -> list[dict]:
    """The cluster's alive nodes as the GCS sees them (resources_total per node).

    A loaded dashboard drops a request now and then: asked again until ``timeout_s``."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            nodes = list_nodes(address=head.dashboard_url, detail=True, limit=100)
            return [n.__dict__ if hasattr(n, "__dict__") else dict(n) for n in nodes if n.state == "ALIVE"]
        except Exception:  # noqa: BLE001 - ServerUnavailable, ConnectionError
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextmanager
def ray_worker(
    head: RayHead,
    num_cpus: int = 1,
    resources: dict[str, float] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[RayWorker]:
    """Join a worker node to ``head`` (no token auth); yield it once the GCS has it alive;
    stop exactly its processes.

    ``resources``: custom resources of the node (e.g. ``{"gen_node": 1}`` so only the
    actors asking for it land here; tests/worker_limits limits the memory of the Ray
    workers of a node offering ``oom_node``).
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="ldwrk", dir="/tmp"))
    resources = dict(resources or {})
    node_port, object_port, agent_port, agent_grpc_port, runtime_env_port, metrics_port = free_ports(6)
    cmd = [
        str(VENV_BIN / "ray"), "start", f"--address={head.gcs_address}", "--block",
        "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}", "--num-gpus=0",
        f"--resources={json.dumps(resources)}", "--object-store-memory=200000000",
        f"--node-manager-port={node_port}", f"--object-manager-port={object_port}",
        f"--dashboard-agent-listen-port={agent_port}", f"--dashboard-agent-grpc-port={agent_grpc_port}",
        f"--runtime-env-agent-port={runtime_env_port}", f"--metrics-export-port={metrics_port}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
        f"--labels={json.dumps({'longdoc-test-node': temp_dir.name})}",  # how the GCS names it
    ]
    log = temp_dir / "worker.log"
    proc = None
    try:
        for attempt in range(3):
            with open(log, "wb") as fh:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(env),
                                        start_new_session=True)
            deadline = time.monotonic() + 120
            while not [n for n in alive_nodes(head)  # event: the GCS has this node alive
                       if (n.get("labels") or {}).get("longdoc-test-node") == temp_dir.name]:
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker node not alive after 120 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)  # polling the GCS for the event above
            else:
                break
            # Ray gives a raylet 30 s to register (hard-coded); a loaded machine can miss
            # that: start the node again.
            if "timed out during startup" not in log.read_text() or attempt == 2:
                raise RuntimeError(f"ray start (worker) exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        yield RayWorker(temp_dir, proc.pid, resources)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the direct children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid:
            out.append((int(entry.name), comm))
    return out


def kill_raylet(worker: RayWorker) -> int:
    """SIGKILL the worker node's raylet (its Ray workers and actors die with it); its pid."""
    raylets = [pid for pid, comm in _children(worker.pid) if comm == "raylet"]
    assert len(raylets) == 1, f"expected one raylet under {worker.pid}, found {raylets}"
    os.kill(raylets[0], signal.SIGKILL)
    return raylets[0]
