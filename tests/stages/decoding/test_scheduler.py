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


def _question(key: int, doc: str, size: int | None) -> Waiting:
    """A question of document ``doc`` (its method reads a document once), ``size`` of them sent."""
    return Waiting(Request(key, PromptParts([], [1] * 50, [2]), [], doc_key=doc, doc_size=size), 0.0)


def test_a_document_whose_questions_came_in_two_calls_is_read_in_one_group():
    """The first call holds d1's three questions and d2's first; the second, d2's other two."""
    s = _scheduler(64 * 256)
    for key, doc in enumerate(["d2", "d1", "d1", "d1"]):  # d2's first question heads the queue
        s.push(_question(key, doc, 3))
    d = s.decide(busy=0, slots=8, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [1, 2, 3]  # the whole document goes first
    # d2 is not whole and the engine is busy (d1's rows decode): it waits for its siblings.
    assert isinstance(s.decide(busy=3, slots=8, capacity=256, filling=False, own_prefill=False), Wait)
    s.push(_question(4, "d2", 3))
    s.push(_question(5, "d2", 3))
    d = s.decide(busy=3, slots=8, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [0, 4, 5] and not s.queue and not s.started


def test_holding_a_document_never_idles_the_engine_and_unsized_requests_keep_their_order():
    s = _scheduler(64 * 256)
    s.push(_question(0, "d", 3))
    d = s.decide(busy=0, slots=8, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [0]  # nothing else to do: it starts alone
    assert s.started == {"d": 1}
    s.push(_question(1, "d", 3))
    s.push(_question(2, "d", 3))  # the rest: whole with the one started
    assert [w.request.key for w in s.decide(busy=1, slots=8, capacity=256, filling=False,
                                             own_prefill=False).group] == [1, 2]
    u = _scheduler(64 * 256)  # doc_size unknown (None): first come, first served as before
    for key, doc in enumerate(["x", "y", "y"]):
        u.push(_question(key, doc, None))
    assert [w.request.key for w in u.decide(busy=0, slots=8, capacity=256, filling=False,
                                             own_prefill=False).group] == [0]


def test_admission_edges_a_full_slot_no_slot_for_the_head_free_slots_and_a_row_alone():
    """A head needing exactly a slot's capacity fits it; a longer layout with no slot left for
    the head waits, and a growing engine's is small; a document's group never exceeds the free slots; a row to be prefilled
    alone is not one ``admits_next`` fills a slot with before a step."""
    s = _scheduler(1024)
    s.push(_waiting(0, 236))  # needs 256: exactly the slots' capacity
    assert isinstance(s.decide(busy=0, slots=2, capacity=256, filling=False, own_prefill=True), Admit)
    s = _scheduler(1024)
    s.push(_waiting(0, 400))  # needs 420 -> 2 slots of 512: none left while 2 rows run
    assert isinstance(s.decide(busy=2, slots=4, capacity=256, filling=False, own_prefill=True), Wait)
    # A growing engine lays longer slots out small (it grows them as rows wait), not as many
    # as the budget holds: each relayout zero-fills every slot.
    s = _scheduler(64 * 256, grow_slots=True)
    s.push(_waiting(0, 400))
    assert s.decide(busy=1, slots=4, capacity=256, filling=False, own_prefill=True) == Relayout(8, 512)
    s = _scheduler(64 * 256)
    for key in range(4):
        s.push(_question(key, "d", 4))
    d = s.decide(busy=0, slots=3, capacity=256, filling=False, own_prefill=False)
    assert [w.request.key for w in d.group] == [0, 1, 2] and [w.request.key for w in s.queue] == [3]
    s = _scheduler(1024)
    s.push(_waiting(0, 10, alone=True))
    assert not s.admits_next(busy=0, slots=2, capacity=256)
    s.push(_waiting(1, 10))
    s.queue.rotate(1)  # the unremarkable row at the head
    assert s.admits_next(busy=0, slots=2, capacity=256)
