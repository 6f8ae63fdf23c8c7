"""How `longdoc eval --metrics nll` conditions a model on a method's compressed earlier text.

Contract: ``condition_for(method, job, device) -> (loaded, condition)`` with the
``Condition`` contract of stages/compression/lm_scoring.py. A method implementing
``ConditionsContinuations`` (Finch: its query sits in its cache) conditions itself;
every other method gets the default: ``text_context``'s ids of the earlier text, then
the method's own prefill with an empty query (a full prefill for text methods and
none; summary vectors of the whole earlier text for a prefill method that compresses
``context_ids``, like the AutoCompressor). ``text_context(method, job)`` -> (doc_ids,
query) -> the ids the method's text compression keeps, outside the pipeline:
``compress_ids`` (runs at tokenize), the stage class on a one-row batch whose question
is ``query`` (text stage; a row error raises ValueError), or the whole document
(prefill: the prefill strategy compresses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from stages.compression.base import CompressionMethod, Loaded
from stages.compression.lm_scoring import Condition, ConditionsContinuations

if TYPE_CHECKING:
    import torch

    from schemas.spec import JobSpec
    from stages.decoding.state import CompressedPrefill


def condition_for(method: CompressionMethod, job: JobSpec, device: torch.device) -> tuple[Loaded, Condition]:
    """The method's own conditioner, else the default (see the module contract)."""
    if isinstance(method, ConditionsContinuations):
        return method.scoring_condition(job, device)
    from stages.prompting import PromptParts

    loaded = method.load(job, device)
    context = text_context(method, job)

    def condition(start_ids: list[int], earlier_ids: list[int], query_tokens: int) -> CompressedPrefill:
        from stages.decoding.state import CompressedPrefill

        query = loaded.tokenizer.decode(list(earlier_ids[-query_tokens:]))
        t0 = time.perf_counter()
        ctx = context(list(earlier_ids), query)
        text_s = time.perf_counter() - t0
        res = loaded.prefill([PromptParts(list(start_ids), ctx, [])])
        return CompressedPrefill(res.state, res.context_tokens, [text_s + res.compress_s[0]])

    return loaded, condition


def text_context(method: CompressionMethod, job: JobSpec) -> Callable[[list[int], str], list[int]]:
    """(doc_ids, query) -> the ids ``method``'s text compression keeps (see the contract)."""
    if method.runs_at == "tokenize":
        from stages.model_loading import load_tokenizer

        config = method.config(job)
        edges = method.tokenizer_edges(load_tokenizer(method.tokenizer_source(job)))
        return lambda ids, query: method.compress_ids(config, ids, edges)
    if method.runs_at == "prefill":
        return lambda ids, query: list(ids)
    from stages.rows import batch_to_rows, rows_to_batch

    stage = method.stage_class()(job.model_dump(mode="json"))

    def run_stage(ids: list[int], query: str) -> list[int]:
        row = {"request_id": "nll", "doc_ids": ids, "question": query, "instruction": query}
        out = batch_to_rows(stage(rows_to_batch([row])))[0]
        if out.get("error"):
            raise ValueError(f"{method.name}: {out['error']}")
        return list(out["context_ids"])

    return run_stage
