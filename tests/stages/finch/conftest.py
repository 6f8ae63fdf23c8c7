"""Finch test settings. (``pythonpath = ["."]`` in pyproject.toml keeps ``tests/stages``
from shadowing the product package ``stages``.)"""

from __future__ import annotations

import pytest
import torch


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
