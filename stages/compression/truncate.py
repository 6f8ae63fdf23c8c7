"""Method ``truncate``: keep an exact number of document tokens (the Finch paper's baseline).

Contract: ``truncate_ids(ids, target, keep, edges)`` returns ``min(target, len(ids))``
tokens: ``head`` keeps the first ones, ``tail`` the last ones, ``head_tail`` the first
ceil(target/2) and the last floor(target/2), in document order; a cut that would split a
character (stages/token_bytes.py ``CharacterEdges``) moves into the kept side, so a few
fewer are kept then (at most a character's other pieces per cut). A slice of the ids
costs no model, so it rides along in the tokenize actor (``runs_at = "tokenize"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from schemas.compression import CompressionSpec
from stages.compression.base import CONTEXT_COLUMNS, CompressionMethod
from stages.token_bytes import NO_EDGES, CharacterEdges


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


def truncate_spans(ids: Sequence[int], target: int, keep: str, edges: CharacterEdges = NO_EDGES) -> list[int]:
    """Where ``truncate_ids`` keeps ``ids``: flattened ``[start, end)`` pairs
    (stages/compression/base.spans_of). Each cut moves to the nearest edge between
    characters inside the kept side (``edges``), so a kept run never starts or ends
    inside a character: at most a character's other pieces fewer than the budget."""
    if target < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target}")
    if keep not in ("head", "tail", "head_tail"):
        raise ValueError(f"keep must be one of head, tail, head_tail; got {keep!r}")
    n = len(ids)
    if n <= target:
        return [0, n] if n else []
    head = {"head": target, "tail": 0, "head_tail": (target + 1) // 2}[keep]
    head = edges.before(ids, head)
    # head_tail gives what the head's cut left to the tail; "head" keeps no tail at all (a
    # moved cut once handed its tokens to the document's last ones).
    tail = edges.after(ids, n - (target - head)) if keep != "head" and target > head else n
    return ([0, head] if head else []) + ([tail, n] if tail < n else [])


def truncate_ids(ids: Sequence[int], target: int, keep: str, edges: CharacterEdges = NO_EDGES) -> list[int]:
    """The ids ``truncate_spans`` keeps, in document order."""
    spans = truncate_spans(ids, target, keep, edges)
    return [t for s, e in zip(spans[::2], spans[1::2], strict=True) for t in ids[s:e]]


class TruncateMethod(CompressionMethod):
    name = "truncate"
    spec_model = TruncateCompression
    summary = "`target_tokens` from the head, tail or both ends (`keep`)"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 1
    runs_at = "tokenize"
    keeps_by_position = True
    needs = ("doc_ids",)
    adds = CONTEXT_COLUMNS
    eval_budgeted = True
    fills_budget = True

    def peer_cut(self, config: TruncateCompression) -> tuple[int, str]:
        return config.target_tokens, config.keep  # the peer's --truncate-tokens/--keep: the same cut

    def compress_spans(self, config: TruncateCompression, doc_ids: list[int], edges: CharacterEdges) -> list[int]:
        return truncate_spans(doc_ids, config.target_tokens, config.keep, edges)
