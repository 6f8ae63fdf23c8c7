"""Admission rules on their own: slots, layouts within the budget, waiting, rejection, groups."""

from __future__ import annotations

from stages.decoding.memory import KvBudget
from stages.decoding.request import Request
from stages.decoding.scheduler import (
    Admit,
    KvBudgetExceeded,
    Reject,
    Relayout,
    Scheduler,
    Wait,
    Waiting,
)
from stages.prompting import PromptParts


def _waiting(key: int, tokens: int, alone: bool = False) -> Waiting:
    return Waiting(Request(key, PromptParts([], [1] * tokens, []), []), 0.0, alone=alone)


def _scheduler(budget_tokens: int, **kw) -> Scheduler:
    # need = prompt + 20 (new tokens + widest step): rows of <= 236 tokens fit 256-token slots.
    return Scheduler(KvBudget(1, budget_tokens), need=lambda kv: kv + 20, **kw)


def test_admits_while_slots_are_free_then_waits():
    s = _scheduler(1024)
    for i, n in enumerate((100, 200, 50)):
        s.push(_waiting(i, n))
    assert isinstance(d := s.decide(busy=0, slots=2, capacity=256, filling=False, own_prefill=True), Admit)
    assert [w.request.key for w in d.group] == [0]  # the engine's own prefill: one at a time
    assert isinstance(s.decide(busy=1, slots=2, capacity=256, filling=True, own_prefill=True), Wait)
    assert isinstance(s.decide(busy=1, slots=2, capacity=256, filling=False, own_prefill=True), Admit)
    assert isinstance(s.decide(busy=2, slots=2, capacity=256, filling=False, own_prefill=True), Wait)
    assert [w.request.key for w in s.queue] == [2]


def test_a_long_head_waits_for_a_longer_layout_and_blocks_the_queue():
    s = _scheduler(1024)
    s.push(_waiting(0, 400))  # needs 420 -> 512-token slots: 2 of them in the budget
    s.push(_waiting(1, 10))
    assert isinstance(s.decide(busy=3, slots=4, capacity=256, filling=False, own_prefill=True), Wait)
    assert s.decide(busy=1, slots=4, capacity=256, filling=False, own_prefill=True) == Relayout(2, 512)
    assert [w.request.key for w in s.queue] == [0, 1]  # first come, first served


def test_a_request_larger_than_the_budget_is_rejected():
    s = _scheduler(512)
    s.push(_waiting(0, 600))
    d = s.decide(busy=0, slots=2, capacity=256, filling=False, own_prefill=True)
    assert isinstance(d, Reject) and isinstance(d.error, KvBudgetExceeded) and "KV budget" in str(d.error)
    assert not s.queue


def test_cpu_grows_slots_for_the_waiting_rows_within_the_budget():
    s = _scheduler(16 * 256, grow_slots=True)
    s.push(_waiting(0, 100))
    # One row waits: at least doubling, so rows that trickle in do not relayout one by one.
    assert s.decide(busy=8, slots=8, capacity=256, filling=False, own_prefill=True) == Relayout(16, 256)
    assert isinstance(s.decide(busy=16, slots=16, capacity=256, filling=False, own_prefill=True), Wait)
    # Many wait: one relayout holds them all (each relayout zero-fills and copies the cache) ...
    s = _scheduler(64 * 256, grow_slots=True)
    for i in range(31):
        s.push(_waiting(i, 100))
    assert s.decide(busy=8, slots=8, capacity=256, filling=False, own_prefill=True) == Relayout(39, 256)
    # ... within what the budget holds.
    for i in range(31, 60):
        s.push(_waiting(i, 100))
    assert s.decide(busy=8, slots=8, capacity=256, filling=False, own_prefill=True) == Relayout(64, 256)


def test_method_prefill_groups_fit_the_free_slots_and_respect_alone():
    s = _scheduler(4096, group_rows=3)
    for i in range(5):
        s.push(_waiting(i, 50, alone=i == 3))
    d = s.decide(busy=0, slots=8, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [0, 1, 2]
    d = s.decide(busy=3, slots=4, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [3]  # a failed group's row comes alone
    d = s.decide(busy=0, slots=8, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [4]
