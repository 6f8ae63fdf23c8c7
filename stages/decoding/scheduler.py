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

One exception, for a method that reads a document once for all its questions
(``Request.doc_key``): a head whose document has fewer requests queued (and started) than
the run sends (``Request.doc_size``) is held while the engine has other work, and the
first request whose document is whole (or that has no document key) goes before it. Why:
a document's questions split across two calls (Ray Data's batches do not follow
documents) reached the method's reading in two groups and the document was read twice;
the second call is already on its way (pipeline/plan.py keeps more than one in flight).
With nothing else to do the engine starts the held head at once: holding never idles it.
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
    # doc_key -> requests of that document already started (``_group``); dropped once whole
    started: dict = field(default_factory=dict)

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
        queued = self._queued_per_document()
        if not own_prefill and not self._whole(self.queue[0], queued):
            ready = next((w for w in self.queue if self._whole(w, queued)), None)
            if ready is None:
                if busy:
                    return Wait()  # the rest of the document comes with the next call
            else:
                self.queue.remove(ready)
                self.queue.appendleft(ready)
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
                    # copies the whole cache (first-touch pages), a cost that doubling slot
                    # by slot paid at every step of the growth.
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

    def _queued_per_document(self) -> dict:
        """doc_key -> queued requests, over the queue's sized documents (``_whole``)."""
        out: dict = {}
        for w in self.queue:
            if w.request.doc_size is not None and w.request.doc_key is not None:
                out[w.request.doc_key] = out.get(w.request.doc_key, 0) + 1
        return out

    def _whole(self, w: Waiting, queued: dict) -> bool:
        """``w`` may start now as far as its document goes: it has no document key or size, it
        is to be prefilled alone, or every request of its document is queued (``queued``:
        ``_queued_per_document``) or started."""
        r = w.request
        if r.doc_key is None or r.doc_size is None or w.alone:
            return True
        return queued.get(r.doc_key, 0) + self.started.get(r.doc_key, 0) >= r.doc_size

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
        queued = self._queued_per_document()
        while (len(group) < min(free, self.group_rows) and self.queue and not self.queue[0].alone
               and self._whole(self.queue[0], queued)):
            if self.need(self.queue[0].kv_tokens) > capacity:
                break
            group.append(self.queue.popleft())
        self._count_started(group)
        return group

    def _count_started(self, group: list[Waiting]) -> None:
        """Remember how many of each sized document's requests have started (``_whole``)."""
        for w in group:
            r = w.request
            if r.doc_key is not None and r.doc_size is not None:
                n = self.started.get(r.doc_key, 0) + 1
                if n >= r.doc_size:
                    self.started.pop(r.doc_key, None)
                else:
                    self.started[r.doc_key] = n
