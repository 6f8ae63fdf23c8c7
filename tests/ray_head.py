"""A real local Ray head (GCS, raylet, dashboard + Jobs API) for cluster tests.

Why not ``ray start`` + ``ray stop --force``: ``ray stop`` kills every Ray process on
the machine by name, including other test sessions' clusters. Instead the head runs
as ``ray start --head --block`` in its own session; SIGTERM to that one process makes
Ray drain and stop exactly the processes it spawned. A private ``--temp-dir`` keeps
its address out of /tmp/ray, so a concurrent ``ray.init()`` elsewhere never attaches
to it, and every port is picked free (outside Ray's worker port range).
"""

from __future__ import annotations

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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    num_cpus: int = 2, token: str | None = None, env: dict[str, str] | None = None
) -> Iterator[RayHead]:
    """Start a head with the dashboard on 127.0.0.1; yield it; stop exactly it.

    ``token``: enable Ray token authentication with this token (clients then need
    RAY_AUTH_MODE=token and RAY_AUTH_TOKEN); None disables it explicitly, so the
    result never depends on a stray ~/.ray/auth_token (which Ray would pick up).
    """
    # Unix socket paths under the temp dir must stay short (< 108 bytes).
    temp_dir = Path(tempfile.mkdtemp(prefix="ldray", dir="/tmp"))
    gcs_port, dash_port = free_port(), free_port()
    cmd = [
        str(VENV_BIN / "ray"), "start", "--head", "--block",
        f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        f"--num-cpus={num_cpus}", "--object-store-memory=300000000",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
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
        _wait_http(f"{head.dashboard_url}/api/version", proc, log, 120, token)
        # The Jobs API answers only once the head's job agent is registered.
        _wait_http(f"{head.dashboard_url}/api/jobs/", proc, log, 60, token)
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
