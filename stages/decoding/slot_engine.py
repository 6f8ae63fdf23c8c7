"""Continuous batching over static KV slots: ``SlotEngine`` (issue 12's GPU path).

Contract: ``SlotEngine(model, slots, ...)`` is made once per actor (it owns the
slots, ``[B_slots, H_kv, S, D]`` per layer, and the step, compiled on CUDA).
``run(lookups, seeds, prefill, config, decode_text)`` generates for N requests
(N may exceed B_slots) and returns ``(results, errors)``, both of length N: a
``RowResult`` per request, or ``None`` with the exception that stopped its
prefill in ``errors`` (the other requests go on). ``prefill(indices)`` is the
caller's prefill strategy for those request indices (full, Finch, AutoCompressor,
...): it returns a ``PrefillState`` with one row per index, in order.

Loop (one decode batch, refilled as rows finish):
1. refill: while slots are free and requests wait, prefill the next group (as many
   as there are free slots) and copy each row into a free slot (SlotCache.load);
   its first token comes from the prefill's logits.
2. draft on the host (drafting.NgramIndex over the ORIGINAL prompt ids + output);
   when ``config.adaptive``, each row is capped by its recent acceptance
   (adaptive.DraftLengths) and the step's width is the bucket that saves the most
   time by adaptive.choose_width (acceptance learned by matched suffix length, step
   cost learned from this engine's own timed steps over batch bucket x width
   tokens), so a wide step that would not pay for itself at a large batch is not
   taken; every ``Tuning.explore_every``-th step feeds what the rows may draft anyway,
   so the models keep learning; rows fill the width with more of their own draft
   (it is computed anyway).
3. one step over the first b slots (b: the batch bucket of the active rows);
   acceptance is decided on the device and read back in ONE transfer (accepted
   counts + argmax for greedy; accepted counts + the sampled token for sampling,
   device_sampling.py: Leviathan et al.'s rule with uniforms keyed by the request's
   seed and output position, so a request samples the same text in any batch).
4. finished rows leave: the last active row moves into the freed slot, so active
   rows stay packed at the front and the batch bucket shrinks with them.

Greedy output equals engine.decode's (and reference.decode_plain's) token for
token in fp32. Sampling follows the model's distribution exactly, like the dynamic
engine, but draws other random numbers (keyed uniforms, not a generator stream), so
the two engines sample different texts from the same seed. In bf16 the step's
reduction order differs from the dynamic path, so greedy agreement is measured
(``longdoc bench decode``), not assumed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from stages.decoding.adaptive import (
    AcceptanceModel,
    DraftLengths,
    StepCost,
    Tuning,
    choose_width,
    default_cost_prior,
    step_indicator,
)
from stages.decoding.config import DecodeConfig, RowResult
from stages.decoding.device_sampling import sample_step
from stages.decoding.drafting import NgramIndex
from stages.decoding.sampling import target_probs
from stages.decoding.slot_step import SlotStep, batch_buckets, bucket, width_buckets
from stages.decoding.slots import SlotCache
from stages.decoding.state import PrefillState
from stages.decoding.stops import StopChecker

Prefiller = Callable[[list[int]], PrefillState]


@dataclass
class _Active:
    """One request occupying a slot (host-side mirror of its slot's state)."""

    request: int
    length: int  # slots filled (== SlotCache.length[slot] once the step is applied)
    seed: int
    index: NgramIndex | None
    result: RowResult = field(default_factory=RowResult)
    first_at: float = 0.0


@dataclass
class SlotStats:
    """What the engine did (for logs and benchmarks): steps, refills, cache growths."""

    steps: int = 0
    refills: int = 0
    grows: int = 0
    max_active: int = 0


class SlotEngine:
    """Continuous batching over a SlotCache (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        slots: int,
        max_drafts: int = 16,
        capacity: int = 512,
        compile: str | bool | None = "auto",
        compile_backend: Callable | None = None,
        tuning: Tuning | None = None,
        min_span: int = 256,
    ) -> None:
        """compile: auto (inductor on CUDA, off on CPU) | inductor | cudagraphs | off (True/False/None:
        inductor/off/auto). On CUDA, inductor runs with mode "reduce-overhead" (its CUDA graphs);
        cudagraphs captures the eager kernels in CUDA graphs without inductor's code generation
        (much faster to compile per shape, but it compiles every (batch, width, span) shape
        apart: see SlotStep's ``symbolic``). ``compile_backend``: a torch.compile backend overriding
        these (tests count compilations with one). ``min_span``: the smallest attention
        span of a step (slot_step.span_buckets; tests lower it)."""
        self.device = next(model.parameters()).device
        mode, backend = compile_plan(compile, self.device)
        if compile_backend is not None:
            backend = compile_backend
        self.cache = SlotCache.for_model(model, slots, capacity)
        self.step = SlotStep(model, self.cache, backend is not None, mode, backend or "inductor", min_span,
                             symbolic=backend != "cudagraphs")
        self.batches = batch_buckets(slots)
        self.widths = width_buckets(max_drafts)
        self.tuning = tuning or Tuning()
        self.stats = SlotStats()
        # What the engine learns across runs (one actor): step cost by tokens computed,
        # acceptance by matched suffix length; they choose each step's width.
        self.cost = StepCost(default_cost_prior(self.device.type), shape=step_indicator)
        self.acceptance = AcceptanceModel()
        self._draft_steps = 0  # steps that could draft, across runs (for exploration)

    @property
    def slots(self) -> int:
        return self.cache.slots

    def describe(self) -> str:
        how = self.step.how
        return f"static slots ({self.slots} x {self.cache.capacity}, {how}) on {self.device}"

    def warm_up(self, greedy: bool = True, max_drafts: int | None = None) -> None:
        """Compile every (batch bucket, width bucket) now, so no request pays for it."""
        widths = self.widths if max_drafts is None else tuple(w for w in self.widths if w <= 1 + max_drafts)
        repeats = 3 if self.step.compiled and self.device.type == "cuda" else 1
        self.step.warm_up(self.batches, widths or (1,), greedy, repeats)

    # ------------------------------------------------------------------ run
    @torch.inference_mode()
    def run(
        self,
        lookups: list[list[int]],
        seeds: list[int],
        prefill: Prefiller,
        config: DecodeConfig,
        decode_text: Callable[[list[int]], str] | None = None,
        tuning: Tuning | None = None,
    ) -> tuple[list[RowResult | None], list[Exception | None]]:
        """Generate for every request (see the module contract); ``tuning`` overrides the
        engine's for this run. ``stats`` afterwards describe this run."""
        n = len(lookups)
        self.stats = SlotStats()
        tuning = tuning or self.tuning
        if len(seeds) != n:
            raise ValueError(f"seeds has {len(seeds)} entries, lookups {n}")
        spec = config.speculative == "prompt_lookup"
        k_max = min(config.num_draft_tokens, self.widths[-1] - 1) if spec else 0
        stopper = StopChecker(config.eos_ids, config.max_new_tokens, config.stop_strings, decode_text)
        lengths = DraftLengths(n, k_max, tuning)
        results: list[RowResult | None] = [None] * n
        errors: list[Exception | None] = [None] * n
        pending = deque(range(n))
        active: list[_Active] = []  # active[s] occupies slot s
        t0 = time.perf_counter()

        def emit(row: _Active, toks: list[int]) -> bool:
            """Append tokens to the row (cut at a stop); True when it finished."""
            res = row.result
            start = len(res.tokens)
            res.tokens.extend(toks)
            keep, reason = stopper.scan(res.tokens, start)
            del res.tokens[keep:]
            now = time.perf_counter() - t0
            if start == 0:  # time to first token: from the run's start (waiting + prefill)
                row.first_at = now
                res.ttft_s = now
            if row.index is not None:
                row.index.extend(res.tokens[start:])
            if reason is None:
                return False
            res.finish_reason = reason
            res.decode_s = now - row.first_at
            results[row.request] = res
            return True

        while pending or active:
            if pending and len(active) < self.slots:
                self._refill(active, pending, prefill, lookups, seeds, config, spec, emit, errors, tuning)
                self.stats.max_active = max(self.stats.max_active, len(active))
                if not active:
                    continue
            drafts, ngrams = self._drafts(active, lengths, config, k_max, tuning) if spec else ([[]] * len(active), [])
            done = self._verify_step(active, drafts, ngrams, config, lengths, spec, emit)
            for s in sorted(done, reverse=True):
                self._leave(active, s)
        return results, errors

    # ------------------------------------------------------------------ pieces
    def _refill(self, active, pending, prefill, lookups, seeds, config, spec, emit, errors, tuning) -> None:
        """Prefill the next group of waiting requests into the free slots."""
        group = [pending.popleft() for _ in range(min(self.slots - len(active), len(pending)))]
        for idx, state in self._prefill_groups(group, prefill, errors):
            self.stats.refills += 1
            if config.greedy:
                firsts = [[t] for t in state.last_logits.argmax(dim=-1).tolist()]
            else:  # position 0 of each request, drawn with its own seed (device_sampling.py)
                probs0 = target_probs(state.last_logits, config.temperature, config.top_p)[:, None]  # [g, 1, V]
                zeros = torch.zeros(len(idx), 1, dtype=torch.long, device=self.device)
                _, tok = sample_step(probs0, zeros, zeros[:, 0] + 1, self._seeds([seeds[i] for i in idx]), zeros[:, 0])
                firsts = [[t] for t in tok.tolist()]
            for j, req in enumerate(idx):
                index = NgramIndex(list(lookups[req]), config.max_ngram, config.min_ngram, tuning.prefer) if spec else None  # noqa: E501
                row = _Active(request=req, length=0, seed=seeds[req], index=index)
                if emit(row, firsts[j]):
                    continue  # finished on its first token: it never takes a slot
                slot = len(active)
                need = int(state.valid[j].sum()) + config.max_new_tokens + self.widths[-1] + 1
                if need > self.cache.capacity:
                    # Grow to what is needed (rounded), yet by at least half, so growing (a
                    # recompilation) stays rare; steps attend over a span, not the capacity.
                    self.cache.grow(max(_round_up(need), _round_up(self.cache.capacity * 3 // 2)))
                    self.stats.grows += 1
                row.length = self.cache.load(slot, state, j)
                active.append(row)

    def _prefill_groups(self, group: list[int], prefill: Prefiller, errors: list[Exception | None]):
        """Yield (indices, state) for ``group``; a failing group is retried row by row."""
        try:
            yield group, prefill(group)
            return
        except Exception as e:  # noqa: BLE001 - one bad request must not sink its group
            if len(group) == 1:
                errors[group[0]] = e
                return
        for i in group:
            try:
                state = prefill([i])
            except Exception as e:  # noqa: BLE001, PERF203 - recorded per request
                errors[i] = e
                continue
            yield [i], state

    def _drafts(
        self, active: list[_Active], lengths: DraftLengths, config: DecodeConfig, k_max: int, tuning: Tuning
    ) -> tuple[list[list[int]], list[int]]:
        """Per active row, the drafts to feed and the suffix length they matched (step 2)."""
        props, ngrams = [], []
        for row in active:
            room = config.max_new_tokens - len(row.result.tokens) - 1  # the bonus token needs a slot
            draft, n = row.index.match(min(k_max, room)) if row.index is not None else ([], 0)
            props.append(draft)
            ngrams.append(n)
        if not config.adaptive:
            return props, ngrams
        allowed = [min(len(p), lengths.allowed(row.request)) for row, p in zip(active, props, strict=True)]
        self._draft_steps += 1
        if tuning.explore_every and self._draft_steps % tuning.explore_every == 0:
            width = bucket(1 + max(allowed), self.widths)  # explore (see Tuning.explore_every)
        else:
            remaining = [config.max_new_tokens - len(row.result.tokens) for row in active]
            width = choose_width(
                allowed, ngrams, self.acceptance, self.cost, tuning.min_gain, remaining,
                candidates=self.widths, fed_rows=bucket(len(active), self.batches),
            )
        return [p[: width - 1] for p in props], ngrams

    def _verify_step(self, active, drafts, ngrams, config, lengths, spec, emit) -> list[int]:
        """One step over the active rows; returns the slots whose rows finished."""
        t_step = time.perf_counter()
        b = len(active)
        size = bucket(b, self.batches)
        width = bucket(1 + max(map(len, drafts)), self.widths)
        rows = [[row.result.tokens[-1], *d] + [0] * (width - 1 - len(d)) for row, d in zip(active, drafts, strict=True)]
        rows += [[0] * width] * (size - b)  # free slots of the bucket: computed, ignored
        n_fed = [1 + len(d) for d in drafts] + [1] * (size - b)
        feed = torch.tensor(rows, dtype=torch.long, device=self.device)  # [size, width]
        # Attend over the filled part only: the smallest span holding every row's step.
        span = bucket(max(row.length for row in active) + width, self.step.spans)
        if config.greedy:
            best, acc = self.step.greedy(feed, torch.tensor(n_fed, device=self.device), span)
            packed = torch.cat([acc[:b, None], best[:b]], dim=1).tolist()  # the step's one host sync
            verdicts = [(r[0], d[: r[0]] + [r[1 + r[0]]]) for r, d in zip(packed, drafts, strict=True)]
            self.cache.advance(acc[:b])
        else:
            probs = target_probs(self.step.step(feed, span)[:b], config.temperature, config.top_p)  # [b, width, V]
            start = torch.tensor([len(row.result.tokens) for row in active], device=self.device)
            acc, tok = sample_step(probs, feed[:b], torch.tensor(n_fed[:b], device=self.device),
                                   self._seeds([row.seed for row in active]), start)
            packed = torch.stack([acc, tok], dim=1).tolist()  # the step's one host sync
            verdicts = [(a, d[:a] + [t]) for (a, t), d in zip(packed, drafts, strict=True)]
            self.cache.advance(acc)
        # The step has synchronised (its results are on the host): wall time is its cost.
        self.cost.observe(size * width, time.perf_counter() - t_step)
        self.stats.steps += 1
        done = []
        for s, (row, d, (a, out)) in enumerate(zip(active, drafts, verdicts, strict=True)):
            res = row.result
            res.decode_steps += 1
            res.draft_tokens += len(d)
            res.accepted_tokens += a
            row.length += a + 1
            if spec:
                lengths.update(row.request, len(d), a)
                self.acceptance.update(ngrams[s], len(d), a)
            if emit(row, out):
                done.append(s)
        return done

    def _seeds(self, seeds: list[int]) -> torch.Tensor:
        """Request seeds as a [g] long device tensor (device_sampling keys its uniforms on them)."""
        return torch.tensor([int(x) % (1 << 63) for x in seeds], dtype=torch.long, device=self.device)

    def _leave(self, active: list[_Active], slot: int) -> None:
        """The row in ``slot`` finished: move the last active row into its slot."""
        last = len(active) - 1
        if slot != last:
            self.cache.move(last, slot, active[last].length)
            active[slot] = active[last]
        active.pop()
        self.cache.free(last)


COMPILE_CHOICES = ("auto", "inductor", "cudagraphs", "off")


def compile_plan(compile: str | bool | None, device: torch.device) -> tuple[str | None, str | None]:
    """(torch.compile mode, backend) for a ``compile`` choice on ``device``; backend None = eager."""
    choice = {True: "inductor", False: "off", None: "auto"}.get(compile, compile)  # type: ignore[arg-type]
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile {compile!r}: allowed: {', '.join(COMPILE_CHOICES)}")
    if choice == "auto":
        choice = "inductor" if device.type == "cuda" else "off"
    if choice == "off":
        return None, None
    if choice == "cudagraphs":
        if device.type != "cuda":
            raise ValueError(f"compile cudagraphs needs a CUDA device, not {device}; allowed here: inductor, off")
        return None, "cudagraphs"
    return ("reduce-overhead" if device.type == "cuda" else None), "inductor"


CAPACITY_STEP = 256  # cache capacities grow in multiples of this many slots


def _round_up(n: int) -> int:
    return -(-int(n) // CAPACITY_STEP) * CAPACITY_STEP
