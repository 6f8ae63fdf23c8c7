"""Method ``none``: the whole document, prefilled as is.

Runs in the generate actor as the full prefill (``CompressionMethod.load``'s default);
a document longer than the model's context becomes an error row before any forward
pass (stages/generate.py's precheck).
"""

from __future__ import annotations

from schemas.compression import NoCompression
from stages.compression.base import CompressionMethod


class NoneMethod(CompressionMethod):
    name = "none"
    spec_model = NoCompression
    summary = "the whole document (must fit the model's context)"
    order = 0
    runs_at = "prefill"
    needs = ("doc_ids",)
