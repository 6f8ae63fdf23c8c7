"""Decoding-engine test setup.

Import path: pytest puts ``tests/`` on ``sys.path`` (the rootdir conftest, no
``__init__.py``), so ``tests/stages`` can be picked up as a namespace package named
``stages`` whose ``decoding`` folder (this one) hides the product's
``stages/decoding``; the editable-install finder runs after the path finder. We
put the repository root first and forget namespace stand-ins already imported.
(``python -m pytest`` has the root on the path already; then this is a no-op.)

Threads: tiny models run many small ops; on a shared 2-core machine two OpenMP
threads spin against each other, so these tests run on one thread.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
for _mod in [m for m in list(sys.modules) if m == "stages" or m.startswith("stages.")]:
    if getattr(sys.modules[_mod], "__file__", None) is None:
        del sys.modules[_mod]

import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama_factory():
    """tests/conftest.make_tiny_llama (loaded by path: every conftest is named ``conftest``)."""
    path = Path(_ROOT) / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_longdoc_root_conftest", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_tiny_llama


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
