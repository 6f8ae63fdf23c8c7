"""Run by Python at the start of every worker process of a job that ships this package
(runtime_env ``py_modules``, see tests/worker_limits): on the one node named by
``LONGDOC_TEST_LIMITED_NODE`` (its ``--temp-dir``, which Ray passes to each worker it
starts there), the process gets RLIMIT_DATA = ``LONGDOC_TEST_WORKER_DATA_MB`` before any
other code runs."""

import os
import resource
import sys

_mb = os.environ.get("LONGDOC_TEST_WORKER_DATA_MB")
_node = os.environ.get("LONGDOC_TEST_LIMITED_NODE")
if _mb and _node and f"--temp-dir={_node}" in sys.argv:
    resource.setrlimit(resource.RLIMIT_DATA, (int(_mb) << 20, int(_mb) << 20))
