"""Decoding-engine test setup.

Threads: tiny models run many small ops; on a shared 2-core machine two OpenMP
threads spin against each other, so these tests run on one thread.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_llama_factory():
    """tests/conftest.make_tiny_llama (loaded by path: every conftest is named ``conftest``)."""
    path = Path(__file__).resolve().parents[2] / "conftest.py"
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
