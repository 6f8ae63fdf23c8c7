"""Ray Data stage for RAG context compression (Ray-agnostic core: ``stages.rag_core``).

Wiring (scheduling is the plan's job, kept apart from what the stage does)::

    ds.map_batches(RagStage, fn_constructor_kwargs={"spec": spec.model_dump(mode="json")},
                   compute=ActorPoolStrategy(size=resources.compress_actors),
                   num_gpus=resources.compress_num_gpus, batch_format="numpy")

Columns: needs ``doc_ids``, ``question``, ``instruction`` (and ``error``); adds
``context_ids`` (list[int]), ``context_tokens`` (int) and ``compress_s`` (float,
this row's share of the batch's compression time; see ``stages.rag.rag_contexts``).
Rows whose ``error`` is set pass through untouched (the three columns null); a row
that fails here gets ``error = "rag: ..."``. Rows are never dropped or reordered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.spec import JobSpec, RagCompression
from stages.rag_core import RagResult, load_embedder, rag_contexts
from stages.rows import batch_to_rows, fail, rows_to_batch

REQUIRES = ("doc_ids", "question", "instruction")
ADDS = ("context_ids", "context_tokens", "compress_s")


def rag_query(row: dict[str, Any]) -> str | None:
    """The text chunks are ranked against: the question (qa), else the instruction."""
    q = row.get("question")
    return q if isinstance(q, str) and q.strip() else row.get("instruction")


class RagStage:
    """Callable class for ``map_batches``: loads tokenizer and embedder once per actor."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from stages.model_loading import load_tokenizer, pick_device

        job = JobSpec.model_validate(spec)
        if not isinstance(job.compression, RagCompression):
            raise ValueError(
                f"RagStage needs compression.method 'rag', got {job.compression.method!r}"
            )
        self.config: RagCompression = job.compression
        self.device = pick_device(job.resources.compress_num_gpus)
        self.tokenizer = load_tokenizer(job.generation.model)
        self.embedder = load_embedder(
            self.config.embedder, self.device, batch_size=self.config.embed_batch_size
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = batch_to_rows(batch)
        live = [r for r in rows if not r.get("error")]
        for r in rows:
            for col in ADDS:
                r.setdefault(col, None)
        if live:
            results = rag_contexts(
                [r.get("doc_ids") for r in live],
                [rag_query(r) for r in live],
                tokenizer=self.tokenizer,
                embedder=self.embedder,
                target_tokens=self.config.target_tokens,
                chunk_tokens=self.config.chunk_tokens,
            )
            for row, res in zip(live, results, strict=True):
                if isinstance(res, RagResult):
                    row["context_ids"] = res.context_ids
                    row["context_tokens"] = len(res.context_ids)
                    row["compress_s"] = float(res.compress_s)
                else:
                    fail(row, "rag", res)
        return rows_to_batch(rows)
