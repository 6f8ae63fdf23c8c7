"""Method ``truncate``: keep an exact number of document tokens (the Finch paper's baseline).

Contract: ``truncate_ids(ids, target, keep)`` returns ``min(target, len(ids))`` tokens:
``head`` keeps the first ones, ``tail`` the last ones, ``head_tail`` the first
ceil(target/2) and the last floor(target/2), in document order. A slice of the ids
costs no model, so it rides along in the tokenize actor (``runs_at = "tokenize"``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from schemas.compression import CompressionSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod


class TruncateCompression(CompressionSpec):
    """Keep target_tokens document tokens from the head, the tail or both ends."""

    method: Literal["truncate"] = "truncate"
    shares_document_prefix: ClassVar[bool] = True  # the cut depends on the document only
    target_tokens: int = Field(default=1024, ge=1, description="Exact context budget in tokens.")
    keep: Literal["head", "tail", "head_tail"] = Field(
        default="head_tail",
        description="Which part of the document to keep; head_tail keeps half from each end "
        "(the Finch paper's truncation baseline).",
    )


def truncate_ids(ids: list[int], target: int, keep: str) -> list[int]:
    if target < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target}")
    if len(ids) <= target:
        return list(ids)
    if keep == "head":
        return list(ids[:target])
    if keep == "tail":
        return list(ids[len(ids) - target :])
    if keep == "head_tail":
        head = (target + 1) // 2
        tail = target - head
        return list(ids[:head]) + (list(ids[len(ids) - tail :]) if tail else [])
    raise ValueError(f"keep must be one of head, tail, head_tail; got {keep!r}")


def truncate_spans(n: int, target: int, keep: str) -> list[int]:
    """Where ``truncate_ids`` of an ``n``-token document sits in it: flattened
    ``[start, end)`` pairs (stages/compression/base.spans_of)."""
    if target < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target}")
    if n <= target:
        return [0, n] if n else []
    if keep == "head":
        return [0, target]
    if keep == "tail":
        return [n - target, n]
    if keep == "head_tail":
        head = (target + 1) // 2
        return [0, head] + ([n - (target - head), n] if target - head else [])
    raise ValueError(f"keep must be one of head, tail, head_tail; got {keep!r}")


class TruncateMethod(CompressionMethod):
    name = "truncate"
    spec_model = TruncateCompression
    summary = "`target_tokens` from the head, tail or both ends (`keep`)"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 1
    runs_at = "tokenize"
    needs = ("doc_ids",)
    adds = CONTEXT_COLUMNS
    eval_budgeted = True

    def compress_ids(self, config: TruncateCompression, doc_ids: list[int]) -> list[int]:
        return truncate_ids(doc_ids, config.target_tokens, config.keep)

    def compress_spans(self, config: TruncateCompression, doc_ids: list[int]) -> list[int]:
        return truncate_spans(len(doc_ids), config.target_tokens, config.keep)
