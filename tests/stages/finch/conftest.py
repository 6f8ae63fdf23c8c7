"""Make ``stages.finch`` resolve to the product package while these tests run.

pytest puts ``tests/`` on ``sys.path`` (rootdir conftest, no ``__init__.py``), where
``tests/stages`` becomes a namespace package named ``stages``; its ``finch`` folder
(this one) then shadows ``stages/finch`` because the editable-install finder is
consulted after the path finder. Putting the repository root first and dropping
namespace stand-ins fixes the lookup; with ``pythonpath = ["."]`` in the pytest
configuration this is a no-op.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
for _name in [n for n in sys.modules if n == "stages" or n.startswith("stages.")]:
    if getattr(sys.modules[_name], "__file__", None) is None:  # a namespace stand-in
        del sys.modules[_name]


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """Run on one thread: on this shared 2-core machine, OpenMP barriers across two
    threads made the tiny-model tests ~50x and the end-to-end test ~2x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
