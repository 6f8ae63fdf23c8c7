"""A memory limit on the Ray workers of one node, set from outside the product (tests only).

How a test gives one node too little memory: the driver's Ray job config
(``RAY_JOB_CONFIG_JSON_ENV_VAR``, Ray's own way to inject a runtime_env into a driver)
ships the ``sitecustomize`` package here (``py_modules``: Ray puts it on every worker's
PYTHONPATH, and Python imports ``sitecustomize`` when a process starts) with the limit
and the node in ``env_vars``. Every Ray worker that process starts on that node (the
generate actor pinned there by a custom resource included) runs with RLIMIT_DATA
(private writable memory: heap, anonymous mappings), so an allocation past the limit
fails for real, as on a machine out of memory: torch raises "can't allocate memory",
Python a MemoryError. The raylet and Ray's agents are not limited (they are not workers).
(Ray's ``worker_process_setup_hook`` was tried first: it did not run in every worker.)
"""

from __future__ import annotations

import json
from pathlib import Path

LIMIT_ENV = "LONGDOC_TEST_WORKER_DATA_MB"
NODE_ENV = "LONGDOC_TEST_LIMITED_NODE"


def job_config_env(limit_mb: int, node_temp_dir: Path) -> dict[str, str]:
    """Environment for a `longdoc run` driver whose job limits the workers of one node
    (the node started with ``--temp-dir node_temp_dir``: tests/ray_head.py RayWorker)."""
    runtime_env = {
        "py_modules": [str(Path(__file__).resolve().parent / "sitecustomize")],
        "env_vars": {LIMIT_ENV: str(limit_mb), NODE_ENV: str(node_temp_dir)},
    }
    return {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": runtime_env})}
