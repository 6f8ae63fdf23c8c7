"""Tokenize stage: documents -> generator token ids, plus token-exact truncation.

Ray: ``TokenizeStage`` is a callable class for ``map_batches`` (one tokenizer per
actor). It adds ``doc_ids``/``doc_tokens`` to every row and, for
``compression.method == "truncate"``, ``context_ids``/``context_tokens``/``compress_s``
(truncation is a slice of the ids, so it rides along rather than costing a pool).
Rows with ``error`` pass through untouched; see stages/rows.py.
"""

from __future__ import annotations

import time

import numpy as np

from schemas.spec import AutoCompressorCompression, JobSpec, TruncateCompression
from stages.model_loading import load_tokenizer
from stages.rows import batch_to_rows, fail, rows_to_batch
from stages.truncate import truncate_ids


def tokenizer_name(spec: JobSpec) -> str:
    """The generating model's tokenizer: an AutoCompressor checkpoint brings its own."""
    if isinstance(spec.compression, AutoCompressorCompression):
        from stages.autocompressor.checkpoint import tokenizer_source

        return tokenizer_source(spec.compression.checkpoint)
    return spec.generation.model


class TokenizeStage:
    def __init__(self, spec: dict) -> None:
        self.spec = JobSpec.model_validate(spec)
        self.tokenizer = load_tokenizer(tokenizer_name(self.spec))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch_to_rows(batch)
        comp = self.spec.compression
        for row in rows:
            row.setdefault("doc_ids", None)
            row.setdefault("doc_tokens", None)
            if row.get("error"):
                continue
            try:
                t0 = time.perf_counter()
                ids = self.encode(row["text"])
                row["doc_ids"], row["doc_tokens"] = ids, len(ids)
                if isinstance(comp, TruncateCompression):
                    ctx = truncate_ids(ids, comp.target_tokens, comp.keep)
                    row["context_ids"], row["context_tokens"] = ctx, len(ctx)
                    row["compress_s"] = time.perf_counter() - t0
            except Exception as e:
                fail(row, "tokenize", e)
        return rows_to_batch(rows)
