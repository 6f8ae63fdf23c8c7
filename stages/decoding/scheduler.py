"""Which waiting request the engine starts next, and when the slots must change: ``Scheduler``.

Contract: the scheduler owns the queue of waiting requests (first come, first served)
and decides, from the engine's state, one of:
- ``Admit(group)``: start these requests now (a group of one for the engine's own
  prefill; up to ``group_rows`` for a method's prefill, all fitting the slots);
- ``Relayout(slots, capacity)``: lay the KV memory out as this many slots of this
  capacity first (keeping the active rows), then ask again;
- ``Reject(waiting, error)``: the head request can never run (it needs more KV tokens
  than the whole budget holds); it leaves the queue;
- ``Wait()``: nothing to start now (no free slot, or the head waits for rows to leave
  so that longer slots fit the budget).
It never allocates, prefills or touches a tensor: the engine carries the decision out.

Rules (engine.py's module docstring, step 1): the head request needs ``need(kv_tokens)``
slots (its prefilled KV tokens + max_new_tokens + the widest step). It is admitted when
a slot is free and its capacity holds that; with no free slot, more slots of the same
capacity are laid out when the budget holds them (``grow_slots``: room for every row
waiting, at least doubling; on CPU, zero-filled memory is touched when allocated, so the
engine starts small and grows in few steps); a head
longer than the slots waits until the active rows fit the budget's layout for it
(fewer, longer slots), then that layout is made. The queue's order is kept: requests
behind a waiting head wait too, so a long request is never starved.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from stages.decoding.memory import KvBudget

if TYPE_CHECKING:
    from stages.decoding.request import Request


class KvBudgetExceeded(ValueError):
    """A request needs more KV slots than the engine's whole memory budget holds."""


@dataclass
class Waiting:
    """A request in the queue (and again after a failed attempt)."""

    request: Request
    submitted: float  # perf_counter at submission: queue and first-token times count from it
    attempts: int = 0
    alone: bool = False  # a method prefill group failed: prefill this one by itself

    @property
    def kv_tokens(self) -> int:
        r = self.request
        return r.kv_tokens if r.kv_tokens is not None else len(r.parts)


@dataclass(frozen=True)
class Admit:
    group: list[Waiting]


@dataclass(frozen=True)
class Relayout:
    slots: int
    capacity: int


@dataclass(frozen=True)
class Reject:
    waiting: Waiting
    error: KvBudgetExceeded


@dataclass(frozen=True)
class Wait:
    pass


Decision = Union[Admit, Relayout, Reject, Wait]  # noqa: UP007 - a runtime alias


@dataclass
class Scheduler:
    """The queue and the admission rules (see the module docstring)."""

    budget: KvBudget
    need: Callable[[int], int]  # KV tokens after prefill -> slots a row needs to decode to its end
    group_rows: int = 1
    grow_slots: bool = False  # add slots (for the waiting rows, within the budget) as rows wait for one
    queue: deque[Waiting] = field(default_factory=deque)

    def push(self, waiting: Waiting) -> None:
        self.queue.append(waiting)

    def __len__(self) -> int:
        return len(self.queue)

    def decide(self, busy: int, slots: int, capacity: int, filling: bool, own_prefill: bool) -> Decision:
        """The next decision for an engine with ``busy`` active rows in ``slots`` slots of
        ``capacity`` tokens; ``filling``: its own prefill of a row is under way (one at a
        time); ``own_prefill``: the engine prefills rows itself (groups of one)."""
        if not self.queue or filling:
            return Wait()
        head = self.queue[0]
        need = self.need(head.kv_tokens)
        if need <= capacity:
            # A document's questions go in together: make room for all of them first when the
            # budget can (the queue is scanned only for a request that has a document key).
            if busy < slots and (own_prefill or head.alone or head.request.doc_key is None
                                 or not self._can_grow(slots, capacity)
                                 or busy + len(self._same_document(head)) <= slots):
                return Admit(self._group(head, slots - busy, capacity, own_prefill))
            if self.grow_slots and self.budget.fixed_slots is None:
                most, _ = self.budget.layout(capacity) or (0, 0)
                if most > slots:
                    # Room for every row waiting now (at least twice the slots, so rows that
                    # trickle in do not relayout one by one): each relayout zero-fills and
                    # copies the whole cache (first-touch pages: 8 -> 16 -> 32 -> 64 slots of
                    # 1,536 tokens took 11.0 s of the sample job's 120 s on the 2-core Xeon).
                    return Relayout(min(most, max(2 * slots, busy + len(self.queue))), capacity)
            return Wait()
        layout = self.budget.layout(need)
        if layout is None:
            self.queue.popleft()
            return Reject(head, KvBudgetExceeded(
                f"the request needs {need} KV tokens ({need * self.budget.bytes_per_token / 2**20:.0f} MiB), "
                f"more than the engine's whole KV budget ({self.budget.describe()}); raise "
                "resources.kv_memory_gb / kv_memory_fraction, or compress the context "
                "(compression.target_tokens)"
            ))
        new_slots, new_capacity = layout
        if self.grow_slots and self.budget.fixed_slots is None:
            new_slots = min(new_slots, max(8, busy + 1))
        if busy + 1 > new_slots:
            return Wait()  # until enough rows have left for the longer slots
        return Relayout(new_slots, new_capacity)

    def admits_next(self, busy: int, slots: int, capacity: int) -> bool:
        """The head request would start as soon as it is asked: a slot is free for it (or
        more slots fit the budget) and it fits the slots' capacity. Pure: nothing changes.
        The engine uses it to fill free slots before a decode step (engine.py, step 2)."""
        if not self.queue or self.queue[0].alone:
            return False
        if self.need(self.queue[0].kv_tokens) > capacity:
            return False
        return busy < slots or self._can_grow(slots, capacity)

    def _same_document(self, head: Waiting) -> list[Waiting]:
        """The queued requests (head included) that share the head's document key."""
        key = head.request.doc_key
        if key is None:
            return [head]
        return [w for w in self.queue if w.request.doc_key == key and not w.alone]

    def _can_grow(self, slots: int, capacity: int) -> bool:
        """More than ``slots`` slots of ``capacity`` fit the budget (and the engine grows)."""
        if not self.grow_slots or self.budget.fixed_slots is not None:
            return False
        most, _ = self.budget.layout(capacity) or (0, 0)
        return most > slots

    def _group(self, head: Waiting, free: int, capacity: int, own_prefill: bool) -> list[Waiting]:
        """The head, plus (a method prefill) the head's document's other queued requests
        (read once, whatever group_rows says) and the next requests, all fitting the
        free slots."""
        group = [self.queue.popleft()]
        if own_prefill or head.alone:
            return group
        if head.request.doc_key is not None:
            for w in self._same_document(head)[: max(0, free - 1)]:
                if self.need(w.kv_tokens) <= capacity:
                    self.queue.remove(w)
                    group.append(w)
        while len(group) < min(free, self.group_rows) and self.queue and not self.queue[0].alone:
            if self.need(self.queue[0].kv_tokens) > capacity:
                break
            group.append(self.queue.popleft())
        return group
