"""What the engine is asked and what it answers: ``Request`` in, ``Finished`` out.

A module of its own so the scheduler (scheduler.py), the service (service.py) and the
generate stage can name the request type without importing the engine, and the engine
can import the scheduler without a circle (tests/stages/test_import_graph.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from stages.decoding.config import RowResult
from stages.prompting import PromptParts


@dataclass
class Request:
    """One generation request (the engine's contract: stages/decoding/engine.py)."""

    key: Hashable  # the caller's handle, returned with the result
    parts: PromptParts  # what the model reads (before a prefill method compresses it)
    lookup_ids: list[int]  # drafting source: the ORIGINAL prefix + document + query ids
    seed: int = 0
    kv_tokens: int | None = None  # KV slots the row holds after its prefill; None: len(parts)
    # Requests with the same doc_key (not None) are handed to one method prefill together,
    # which reads their document once (compression.base.reads_once_per_document).
    doc_key: Hashable | None = None
    # How many requests of that document this run sends (None: unknown). While fewer are
    # queued and the engine has other work, the scheduler starts other requests first, so a
    # document whose questions came in two calls is still read once (scheduler.py).
    doc_size: int | None = None


@dataclass
class Finished:
    """A request's outcome: its ``result``, or the ``error`` that stopped it after its retries."""

    key: Hashable
    result: RowResult | None  # None when ``error`` is set
    error: BaseException | None = None
