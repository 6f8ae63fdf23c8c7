"""stages/finch/passes.py: the pieces both readings share."""

from __future__ import annotations

import torch

from stages.finch.passes import next_kept


def test_next_kept_follows_each_schedule_and_holds_once_a_document_ends() -> None:
    kept = torch.tensor([3, 5, 0])
    schedules = [[3, 6, 9], [5], []]
    assert next_kept(schedules, kept, 1).tolist() == [6, 5, 0]
    assert next_kept(schedules, kept, 2).tolist() == [9, 5, 0]
