"""Truncation: keep an exact number of document tokens (the Finch paper's baseline).

Contract: ``truncate_ids(ids, target, keep)`` returns ``min(target, len(ids))`` tokens:
``head`` keeps the first ones, ``tail`` the last ones, ``head_tail`` the first
ceil(target/2) and the last floor(target/2), in document order.
"""

from __future__ import annotations


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
