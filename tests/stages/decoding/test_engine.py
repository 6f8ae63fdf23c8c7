"""The one engine against the reference decoder, on a tiny random Llama in fp32.

Greedy output must equal reference.decode_plain token for token: with and without
drafts (both drafters), with drafts accepted and rejected, whatever the slot count,
memory budget, prefill chunking, admission order and arrival time of requests (later
"Ray batches" join while earlier rows decode), for the engine's own chunked prefill
and for a method's prefill (compressed caches with holes, decode steps run between its
chunks). Failures stay per request; counts in = counts out.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
from tiny_models import WINDOWED

from schemas.output import mean_accepted_per_step
from stages.decoding.adaptive import Tuning
from stages.decoding.config import DecodeConfig
from stages.decoding.drafters import drafter_names
from stages.decoding.engine import Engine, KvBudgetExceeded
from stages.decoding.memory import KvBudget
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.slots import bytes_per_token, layer_shapes_of
from stages.decoding.state import CompressedPrefill, prefill_full
from stages.prompting import PromptParts

NO_EOS = frozenset({-1})
LENGTHS = (3, 11, 26, 7, 40, 5, 17)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 2000, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def plain_runs(tiny_model, prompts) -> list[list[int]]:
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS)
    return [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)]


def _requests(prompts, lookups, seeds=None) -> list[Request]:
    seeds = seeds or [0] * len(prompts)
    return [Request(i, PromptParts([], list(p), []), list(lk), s) for i, (p, lk, s) in
            enumerate(zip(prompts, lookups, seeds, strict=True))]


def _budget(model, tokens: int) -> KvBudget:
    """A KV budget of ``tokens`` tokens for ``model`` (fp32)."""
    per = bytes_per_token(layer_shapes_of(model), torch.float32)
    return KvBudget(per, tokens * per)


# Every drafter the registry finds (a new one is checked without a line here).
@pytest.mark.parametrize("speculative", drafter_names())
# None: admitted by the memory budget; chunk 8: prompts prefill in several chunks.
@pytest.mark.parametrize(("slots", "chunk"), [(1, 8), (3, 2048), (None, 8)])
@pytest.mark.parametrize("lookup_kind", ["prompt", "oracle"])
def test_greedy_identical_to_reference(tiny_model, prompts, plain_runs, speculative, slots, lookup_kind, chunk):
    eos = plain_runs[1][4]  # ends row 1 early; others at other steps or the limit
    cfg = DecodeConfig(
        max_new_tokens=20, eos_ids=frozenset({eos}), speculative=speculative, num_draft_tokens=5, adaptive=False,
    )
    ref = decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)
    assert len({len(r.tokens) for r in ref}) > 1, "rows should finish at different steps"
    # "oracle": the lookup source holds the model's own continuation, so drafts get accepted.
    lookups = [p + r if lookup_kind == "oracle" else list(p) for p, r in zip(prompts, plain_runs, strict=True)]
    budget = _budget(tiny_model, 3 * 256) if slots is None else None
    eng = Engine(tiny_model, cfg, slots=slots, budget=budget, expected_tokens=16, chunk_tokens=chunk)
    out = eng.run(_requests(prompts, lookups))
    assert [o.error for o in out] == [None] * len(prompts)
    for a, b in zip(ref, out, strict=True):
        assert (b.result.tokens, b.result.finish_reason) == (a.tokens, a.finish_reason)
    assert eng.stats.max_active <= eng.cache.slots and eng.stats.rows_done == len(prompts)
    if speculative != "none" and lookup_kind == "oracle":
        assert sum(o.result.accepted_tokens for o in out) > 0


def test_adaptive_drafting_keeps_greedy_output(tiny_model, prompts, plain_runs):
    noise = torch.Generator().manual_seed(7)
    # Half the rows look up their own continuation, half a scrambled one (rejections).
    lookups = [p + r if i % 2 else p + r[::-1] + torch.randint(3, 2000, (10,), generator=noise).tolist()
               for i, (p, r) in enumerate(zip(prompts, plain_runs, strict=True))]
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS, speculative="prompt_lookup", num_draft_tokens=8)
    out = Engine(tiny_model, cfg, slots=4, expected_tokens=16).run(_requests(prompts, lookups))
    assert [o.result.tokens for o in out] == plain_runs
    assert sum(o.result.draft_tokens - o.result.accepted_tokens for o in out) > 0  # rejections happened


def test_an_exploring_step_is_one_width_past_the_models_choice(tiny_model, prompts, plain_runs, monkeypatch):
    """Tuning.explore_every: the widest step costs several ordinary ones on a CPU; exploring
    one width past choose_width's choice keeps the models learning for far less."""
    import stages.decoding.engine as engine_module

    events: list[tuple[str, int]] = []
    real_choose = engine_module.choose_width

    def choose(*args, **kwargs):
        width = real_choose(*args, **kwargs)
        events.append(("chosen", width))
        return width

    monkeypatch.setattr(engine_module, "choose_width", choose)
    noise = torch.Generator().manual_seed(8)
    lookups = [p + torch.randint(3, 2000, (30,), generator=noise).tolist() + p for p in prompts]  # long drafts, rejected
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS, speculative="prompt_lookup", num_draft_tokens=8)
    # min_gain out of reach: the models always choose plain decoding (width 1), whatever the
    # measured step costs, and every drafting step explores.
    eng = Engine(tiny_model, cfg, slots=4, expected_tokens=16, tuning=Tuning(explore_every=1, min_gain=1e9))
    real_greedy = eng.step_fn.greedy

    def greedy(feed, n_fed, span=None):
        events.append(("fed", feed.shape[1]))
        return real_greedy(feed, n_fed, span)

    monkeypatch.setattr(eng.step_fn, "greedy", greedy)
    out = eng.run(_requests(prompts, lookups))
    assert [o.result.tokens for o in out] == plain_runs
    pairs = [(events[i][1], events[i + 1][1]) for i in range(len(events) - 1)
             if events[i][0] == "chosen" and events[i + 1][0] == "fed"]
    assert pairs and all((chosen, fed) == (1, 2) for chosen, fed in pairs)  # not 1 + the longest draft (up to 9)


def test_later_requests_join_while_earlier_ones_decode(tiny_model, prompts, plain_runs):
    """What the generate actor does across Ray batches: the pool never drains in between."""
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS, speculative="prompt_lookup", num_draft_tokens=4)
    eng = Engine(tiny_model, cfg, slots=4, expected_tokens=16, chunk_tokens=8)
    reqs = _requests(prompts, [p + r for p, r in zip(prompts, plain_runs, strict=True)])
    got, mixed = {}, False
    for r in reqs[:3]:
        eng.submit(r)
    for _ in range(6):
        for f in eng.step():
            got[f.key] = f
    assert eng.active and not got, "the first batch is still decoding"
    for r in reqs[3:]:  # the next Ray batch arrives
        eng.submit(r)
    while not eng.idle():
        keys = {row.waiting.request.key for row in eng.active}
        mixed |= bool(keys & {0, 1, 2}) and bool(keys - {0, 1, 2})  # both batches decode together
        for f in eng.step():
            got[f.key] = f
    assert mixed and sorted(got) == list(range(len(prompts)))
    assert [got[i].result.tokens for i in range(len(prompts))] == plain_runs
    assert eng.stats.max_active == 4


def test_memory_budget_admission_with_mixed_lengths(tiny_model, plain_runs, prompts):
    """A budget of 2 x 256 tokens: short rows run two at a time; a 300-token prompt needs a
    512-token slot, waits until the others leave, then runs alone; one that no layout can
    hold fails with KvBudgetExceeded; nothing else fails and nothing is allocated past it."""
    g = torch.Generator().manual_seed(5)
    long_prompt = torch.randint(3, 2000, (300,), generator=g).tolist()
    huge_prompt = torch.randint(3, 2000, (600,), generator=g).tolist()
    mixed = [prompts[0], long_prompt, prompts[1], huge_prompt, prompts[2], prompts[3]]
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, budget=_budget(tiny_model, 512), expected_tokens=16)
    assert (eng.cache.slots, eng.cache.capacity) == (2, 256)
    out = eng.run(_requests(mixed, mixed))
    assert len(out) == len(mixed)  # counts in = counts out
    assert isinstance(out[3].error, KvBudgetExceeded) and "KV budget" in str(out[3].error)
    ok = [i for i in range(len(mixed)) if i != 3]
    ref = decode_plain(tiny_model, prefill_full(tiny_model, [mixed[i] for i in ok], 0), cfg)
    assert [out[i].result.tokens for i in ok] == [r.tokens for r in ref]
    assert eng.stats.relayouts >= 1  # 2 x 256 -> 1 x 512 for the long row
    assert eng.cache.slots * eng.cache.capacity <= 512
    assert out[1].result.queue_s > 0  # it waited for memory


def test_cpu_slots_grow_within_the_budget_as_rows_wait(tiny_model, prompts, plain_runs):
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, budget=_budget(tiny_model, 64 * 256), expected_tokens=16)
    assert eng.cache.slots == 8  # CPU starts small (zero-filled memory is touched)
    many = prompts * 3
    out = eng.run(_requests(many, many))
    assert [o.result.tokens for o in out] == plain_runs * 3
    assert eng.cache.slots > 8 and eng.stats.max_active > 8
    # Every row was waiting at once: one relayout made room for all of them (each relayout
    # zero-fills and copies the whole cache), not one per doubling.
    assert eng.stats.relayouts == 1 and eng.cache.slots == len(many)


def test_activity_says_what_the_engine_holds(tiny_model, prompts):
    eng = Engine(tiny_model, DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS), slots=2, expected_tokens=48,
                 chunk_tokens=8)
    for r in _requests(prompts[1:4], prompts[1:4]):
        eng.submit(r)
    assert eng.activity() == "0 decoding (0 tokens), 0 prefilling, 3 queued"
    eng.step()  # the first row's first chunk of 8 of its 11 tokens
    assert eng.activity() == "0 decoding (0 tokens), 1 prefilling, 2 queued"
    # its last 3 tokens: it joins with its first token; 3 < 8 tokens this iteration, so
    # the second row's first chunk of 8 too; then the first row decodes one more
    eng.step()
    assert eng.activity() == "1 decoding (2 tokens), 1 prefilling, 1 queued"
    # the progress line's ETA (pipeline/progress.py): nothing finished, one row with 2 tokens,
    # and so far only prefill and one decode step
    finished, finished_tokens, decoding, tokens, prefill_share = eng.progress()
    assert (finished, finished_tokens, decoding, tokens) == (0, 0, 1, 2) and 0.0 < prefill_share < 1.0
    while not eng.idle():
        eng.step()
    assert eng.activity() == "0 decoding (0 tokens), 0 prefilling, 0 queued"
    finished, finished_tokens, decoding, tokens, prefill_share = eng.progress()
    assert (finished, finished_tokens, decoding, tokens) == (3, 12, 0, 0)  # 3 rows of max_new_tokens 4
    busy = eng.stats.prefill_s + eng.stats.step_s
    assert prefill_share == pytest.approx(eng.stats.prefill_s / busy)


def test_an_iteration_prefills_rows_until_its_token_budget_is_spent(tiny_model, prompts):
    # Short prompts: one iteration takes whole rows until chunk_tokens prompt tokens are
    # prefilled (the last may pass it), then its one decode step.
    lengths = [len(p) for p in prompts[:4]]
    budget = lengths[0] + lengths[1] + 1  # the first two rows leave room: a third starts
    eng = Engine(tiny_model, DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS), slots=4, expected_tokens=48,
                 chunk_tokens=max(budget, *lengths))
    for r in _requests(prompts[:4], prompts[:4]):
        eng.submit(r)
    eng.step()
    assert eng.activity() == "3 decoding (6 tokens), 0 prefilling, 1 queued"
    assert eng.stats.steps == 1


def _method_prefill(model, holes: bool, calls: list):
    """A method's prefill (like Finch's): whole prompts prefilled in one padded batch, then
    (``holes``) a stretch of each long row dropped; calls on_chunk between 'chunks'."""

    def prefill(parts: list[PromptParts], on_chunk=None) -> CompressedPrefill:
        for _ in range(3):
            if on_chunk is not None:
                on_chunk()
                calls.append(1)
        state = prefill_full(model, [p.full_ids for p in parts], 0)
        if holes:
            with torch.inference_mode():
                for j, p in enumerate(parts):
                    if len(p.full_ids) > 20:
                        state.valid[j, -15:-7] = False
        kept = [int(state.valid[j].sum()) for j in range(len(parts))]
        return CompressedPrefill(state, kept, [0.01] * len(parts))

    return prefill


@pytest.mark.parametrize("group_rows", [1, 3])
def test_a_methods_prefill_with_holes_and_decode_steps_between_its_chunks(tiny_model, prompts, plain_runs, group_rows):
    calls: list = []
    prefill = _method_prefill(tiny_model, holes=True, calls=calls)
    state = prefill([PromptParts([], p, []) for p in prompts])
    cfg = DecodeConfig(max_new_tokens=12, eos_ids=NO_EOS, speculative="prompt_lookup", adaptive=False)
    ref = decode_plain(tiny_model, copy.deepcopy(state.state), cfg)
    calls.clear()
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=3, expected_tokens=16, group_rows=group_rows)
    out = eng.run(_requests(prompts, [p + r for p, r in zip(prompts, plain_runs, strict=True)]))
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    assert [o.result.tokens for o in out] != plain_runs  # the holes changed what the rows see
    assert calls  # the engine was offered its decode steps between the method's chunks
    if group_rows == 1:  # rows decoded while newcomers prefilled (a group of 3 fills every slot)
        assert eng.stats.stall_s > 0
        # each stalled second is charged to the rows that waited; the first row admitted
        # waited for the others' prefills, the last one for nobody's
        assert out[0].result.stall_s > 0 and out[-1].result.stall_s == 0
        assert max(o.result.stall_s for o in out) <= eng.stats.stall_s + 1e-9
    else:
        assert eng.stats.stall_s == 0 and all(o.result.stall_s == 0 for o in out)
    assert [o.result.context_tokens for o in out] == state.context_tokens
    # the method's 0.01 s, read on the engine's clock (a one-thread host's CPU time is at most
    # the wall time the method measured in)
    assert all(0 < o.result.compress_s <= 0.01 for o in out)


def test_a_methods_prefill_fills_free_slots_before_a_decode_step(tiny_model, prompts, plain_runs):
    """Fill first: while waiting rows would start in free slots, no narrow decode step runs
    between the method's chunks, so rows that fit the slots decode together (one step a
    token) and still give the text of separate decoding."""
    calls: list = []
    prefill = _method_prefill(tiny_model, holes=False, calls=calls)
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=NO_EOS, adaptive=False)
    ref = decode_plain(tiny_model, prefill([PromptParts([], p, []) for p in prompts[:4]]).state, cfg)
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=4, expected_tokens=48, group_rows=1)
    out = eng.run(_requests(prompts[:4], prompts[:4]))
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    # rows 1-3 start with no step between them; the last row's 3 chunks each give rows 1-3
    # a step (nobody waits for a slot any more); then 5 steps for the rest (the first
    # token comes from each prefill's logits). Without fill first: a step per chunk of
    # rows 2-4 too.
    assert eng.stats.steps == 3 + 5 and eng.stats.max_active == 4
    # with a slot short, the fourth row waits: steps run between its chunks again
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=3, expected_tokens=48, group_rows=1)
    out = eng.run(_requests(prompts[:4], prompts[:4]))
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    assert eng.stats.steps > 3 + 5
    # Rows that have waited fill_first_max_wait_s for a step get one between chunks and
    # between groups (a 32k-token document's reading held ten rows for 5.5 minutes): here
    # at once, so every chunk after the first row joined gives the running rows a step.
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=4, expected_tokens=48, group_rows=1)
    eng.fill_first_max_wait_s = 0.0
    out = eng.run(_requests(prompts[:4], prompts[:4]))
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]  # the same text
    assert eng.stats.steps > 3 + 5


def test_activity_counts_the_rows_inside_a_methods_prefill(tiny_model, prompts):
    """A long Finch pass must not look like a hang: its rows show as compressing."""
    seen: list[str] = []
    inner = _method_prefill(tiny_model, holes=False, calls=[])
    eng: Engine

    def prefill(parts, on_chunk=None):
        seen.append(eng.activity())
        on_chunk()  # the method read a chunk: the line moves within a long document
        seen.append(eng.activity())
        return inner(parts, on_chunk)

    cfg = DecodeConfig(max_new_tokens=2, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=3, expected_tokens=16, group_rows=3)
    reqs = _requests(prompts[:3], prompts[:3])
    eng.run(reqs)
    tokens = sum(len(r.parts.context_ids) for r in reqs)
    assert seen and f"3 compressing ({tokens} document tokens, chunks read: 0)" in seen[0], seen
    assert f"3 compressing ({tokens} document tokens, chunks read: 1)" in seen[1], seen
    assert eng.stats.compressing == 0 and "compressing" not in eng.activity()


def test_activity_says_the_chunks_left_of_a_long_reading_and_the_time_left(tiny_model, prompts):
    """A 63k-token document read for ten minutes: the line says which chunk of how many, and
    the time left at the rate so far."""
    seen: list[str] = []
    inner = _method_prefill(tiny_model, holes=False, calls=[])
    eng: Engine

    def prefill(parts, on_chunk=None):
        for _ in range(3):
            time.sleep(0.05)
            on_chunk()
            seen.append(eng.activity())
        return inner(parts, on_chunk)

    cfg = DecodeConfig(max_new_tokens=2, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, prefill=prefill, reading_chunk=4, slots=3, expected_tokens=16, group_rows=3)
    reqs = _requests(prompts[:3], prompts[:3])
    longest = max(len(r.parts.context_ids) for r in reqs)
    eng.run(reqs)
    total = -(-longest // 4)
    assert total > 3 and f"chunk 1 of {total})" in seen[0], seen  # no estimate from one chunk
    assert f"chunk 2 of {total}, ~" in seen[1] and "s left)" in seen[1], seen


@pytest.mark.parametrize("max_new", [1, 2, 5])
def test_max_new_tokens_never_exceeded(tiny_model, prompts, plain_runs, max_new):
    lookups = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_ids=NO_EOS, speculative="prompt_lookup",
                       num_draft_tokens=8, adaptive=False)
    out = Engine(tiny_model, cfg, slots=3, expected_tokens=16).run(_requests(prompts, lookups))
    for o, run in zip(out, plain_runs, strict=True):
        assert o.result.tokens == run[:max_new] and o.result.finish_reason == "length"


@pytest.mark.parametrize("speculative", ["none", "prompt_lookup"])
def test_a_request_samples_the_same_text_in_any_batch(tiny_model, prompts, plain_runs, speculative):
    """Uniforms keyed by (seed, position): slots, batch mates and admission order do not matter."""
    cfg = DecodeConfig(
        max_new_tokens=14, eos_ids=NO_EOS, temperature=0.9, top_p=0.8, speculative=speculative, num_draft_tokens=4,
    )
    seeds = [11 + i for i in range(len(prompts))]
    lookups = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    together = Engine(tiny_model, cfg, slots=3, expected_tokens=16).run(_requests(prompts, lookups, seeds))
    order = list(reversed(range(len(prompts))))
    alone = Engine(tiny_model, cfg, slots=1, expected_tokens=16, chunk_tokens=8).run(
        _requests([prompts[i] for i in order], [lookups[i] for i in order], [seeds[i] for i in order])
    )
    assert [o.result.tokens for o in together] == [alone[order.index(i)].result.tokens for i in range(len(prompts))]
    assert [o.result.tokens for o in together] != [r[:14] for r in plain_runs]  # it did sample
    other = Engine(tiny_model, cfg, slots=3, expected_tokens=16).run(
        _requests(prompts, lookups, [s + 1 for s in seeds]))
    assert [o.result.tokens for o in other] != [o.result.tokens for o in together]  # the seed matters


def test_a_failing_prefill_fails_only_its_request_after_its_retries(tiny_model, prompts):
    broken = [list(p) for p in prompts]
    broken[3] = [10**9]  # out of vocabulary: its prefill raises
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, slots=2, expected_tokens=16, max_retries=2)
    out = eng.run(_requests(broken, broken))
    assert out[3].result is None and isinstance(out[3].error, IndexError)
    assert all(o.result is not None and len(o.result.tokens) == 6 for i, o in enumerate(out) if i != 3)
    assert eng.stats.rows_done == len(prompts)


def test_a_failing_step_sends_its_rows_back_and_they_finish(tiny_model, prompts, plain_runs, monkeypatch):
    cfg = DecodeConfig(max_new_tokens=10, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, slots=3, expected_tokens=16, max_retries=1)
    real, failed = eng.step_fn.greedy, []

    def flaky(*args, **kwargs):
        if eng.stats.steps == 4 and not failed:
            failed.append(1)
            raise RuntimeError("device hiccup")
        return real(*args, **kwargs)

    monkeypatch.setattr(eng.step_fn, "greedy", flaky)
    out = eng.run(_requests(prompts, prompts))
    assert failed and [o.result.tokens for o in out] == [r[:10] for r in plain_runs]


def test_stats_columns_consistent(tiny_model, prompts, plain_runs):
    lookups = [p + r for p, r in zip(prompts, plain_runs, strict=True)]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup", adaptive=False)
    eng = Engine(tiny_model, cfg, slots=2, expected_tokens=16)
    out = [o.result for o in eng.run(_requests(prompts, lookups))]
    for r in out:
        assert 0 <= r.accepted_tokens <= r.draft_tokens
        assert len(r.tokens) == 16 and len(r.tokens) <= 1 + r.decode_steps + r.accepted_tokens
        assert r.ttft_s > 0 and r.decode_s >= 0 and r.prefill_s > 0 and r.queue_s >= 0
        assert mean_accepted_per_step(len(r.tokens), r.decode_steps) > 1.0
    # Each row's device share adds up to the engine's busy time (prefills + steps).
    total = sum(r.device_s for r in out)
    assert total == pytest.approx(eng.stats.prefill_s + eng.stats.step_s, rel=1e-6)
    assert eng.stats.tokens_out == sum(len(r.tokens) for r in out)


def test_the_suffix_drafter_drafts_from_earlier_outputs(tiny_model, prompts, plain_runs):
    """Rows whose prompts share nothing with their output still get accepted drafts once an
    earlier row generated the same text: the outputs the run already wrote."""
    same = [prompts[2]] * 4  # four requests with one prompt: the same greedy output
    noise = torch.Generator().manual_seed(9)
    lookups = [torch.randint(3, 2000, (30,), generator=noise).tolist() for _ in same]  # useless prompts
    cfg = DecodeConfig(max_new_tokens=24, eos_ids=NO_EOS, speculative="suffix", num_draft_tokens=6, adaptive=False)
    eng = Engine(tiny_model, cfg, slots=1, expected_tokens=16)
    out = [o.result for o in eng.run(_requests(same, lookups))]
    assert all(r.tokens == plain_runs[2] for r in out)
    assert out[0].accepted_tokens < out[3].accepted_tokens  # the later rows drafted from the first
    assert out[3].decode_steps < out[0].decode_steps


def test_configure_needs_an_idle_engine_and_bad_settings_raise(tiny_model, prompts):
    cfg = DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, slots=1, expected_tokens=16)
    eng.submit(_requests(prompts, prompts)[0])
    with pytest.raises(RuntimeError, match="idle"):
        eng.configure(cfg)
    with pytest.raises(ValueError, match="speculative method 'medusa'"):
        Engine(tiny_model, DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS, speculative="medusa"), slots=1)
    with pytest.raises(KvBudgetExceeded, match="holds no slot"):
        Engine(tiny_model, cfg, budget=_budget(tiny_model, 100), expected_tokens=16)
    with pytest.raises(ValueError, match="unique"):
        Engine(tiny_model, cfg, slots=1, expected_tokens=16).run(_requests(prompts[:1], prompts[:1]) * 2)


@pytest.mark.parametrize("family", sorted(WINDOWED))
@pytest.mark.parametrize(("speculative", "chunk"), [("none", 2048), ("prompt_lookup", 8)])
def test_sliding_window_models_decode_as_the_model_itself(family, speculative, chunk, prompts):
    from tiny_models import own_greedy, windowed_lm

    model = windowed_lm(2000, family)
    own = [own_greedy(model, p, 16) for p in prompts]
    # The window must matter for these prompts, or the test could not fail.
    assert own != [own_greedy(windowed_lm(2000, family, widen=True), p, 16) for p in prompts]
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative=speculative, num_draft_tokens=4, adaptive=False)
    # Oracle lookups: drafts get accepted, so verify steps of several tokens run windowed too.
    lookups = [p + r for p, r in zip(prompts, own, strict=True)]
    out = Engine(model, cfg, slots=3, expected_tokens=16, chunk_tokens=chunk).run(_requests(prompts, lookups))
    assert [o.error for o in out] == [None] * len(prompts)
    assert [o.result.tokens for o in out] == own


def test_models_whose_arithmetic_the_engine_would_change_are_refused_by_name():
    from tiny_models import tiny_causal_lm

    cfg = DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS)
    capped = tiny_causal_lm(64, "gemma3", final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0.*without it"):
        Engine(capped, cfg, slots=2)
    eager = tiny_causal_lm(64, "gemma3", sliding_window=6, layer_types=["sliding_attention", "full_attention"])
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="sliding windows.*attn_implementation='eager'.*'sdpa'"):
        Engine(eager, cfg, slots=2)


# ----------------------------------------------------------------------------- per-actor state
def _learned(eng: Engine) -> tuple:
    """What an engine has learned: its step-cost fit and acceptance counts."""
    c = eng.cost
    return (c.coefficients(), [row[:] for row in c._xtx], c._xty[:],
            {k: v[:] for k, v in eng.acceptance.first.items()}, {k: v[:] for k, v in eng.acceptance.cont.items()})


def _pld(model, eng: Engine, prompts, runs) -> int:
    """Greedy PLD with the model's own continuation as lookup (drafts accepted); accepted tokens."""
    out = eng.run(_requests(prompts, [p + r for p, r in zip(prompts, runs, strict=True)]))
    return sum(o.result.accepted_tokens for o in out)


def _globals_snapshot() -> dict:
    """Per stages.decoding module global: containers by value, everything else by identity."""
    import importlib
    import pkgutil

    import stages.decoding
    import stages.decoding.drafters

    snap = {}
    for pkg in (stages.decoding, stages.decoding.drafters):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for name, value in vars(mod).items():
                if isinstance(value, (dict, list, set, bytearray)):
                    snap[(mod.__name__, name)] = (id(value), repr(value))
                elif not name.startswith("__"):
                    snap[(mod.__name__, name)] = id(value)
    return snap


def test_two_engines_learn_independently_and_module_globals_stay_as_they_were(tiny_llama_factory):
    """DESIGN: what the engine learns (step cost, acceptance, drafter outputs) lives in the
    engine its actor owns, never in module globals."""
    a_model, b_model = tiny_llama_factory(3000, seed=1), tiny_llama_factory(3000, seed=2)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (6, 13)]
    plain = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS)
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="suffix", num_draft_tokens=4, adaptive=False)
    runs = {m: [r.tokens for r in decode_plain(m, prefill_full(m, prompts, 0), plain)] for m in (a_model, b_model)}
    _globals_snapshot()  # imports every module first (a package gains its submodules as attributes)
    before = _globals_snapshot()
    a, b = (Engine(m, cfg, slots=2, expected_tokens=16) for m in (a_model, b_model))
    fresh = _learned(b)
    assert _pld(a_model, a, prompts, runs[a_model]) > 0
    after_a = _learned(a)
    assert after_a != fresh and _learned(b) == fresh  # b saw none of a's steps
    assert len(a.drafter.outputs) == 2 and len(b.drafter.outputs) == 0
    assert _pld(b_model, b, prompts, runs[b_model]) > 0
    assert _learned(a) == after_a and _learned(b) != fresh
    after = _globals_snapshot()
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not changed, f"module globals changed: {sorted(changed)}"


def test_a_methods_compress_s_is_read_on_the_engines_clock(tiny_model, prompts):
    """On a one-thread host the engine times in the thread's CPU seconds, the method in wall
    seconds; on a loaded machine a row's compress_s came out above its prefill_s, though it
    is a part of it. Here the engine's clock runs at half the wall's pace."""
    wall0 = time.perf_counter()

    def prefill(parts, on_chunk=None):
        t = time.perf_counter()
        time.sleep(0.2)
        out = prefill_full(tiny_model, [p.full_ids for p in parts], 0)
        share = (time.perf_counter() - t) / len(parts)  # each row's share of the reading, in wall seconds
        return CompressedPrefill(out, [len(p.full_ids) for p in parts], [share] * len(parts))

    cfg = DecodeConfig(max_new_tokens=2, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, prefill=prefill, slots=2, expected_tokens=16, group_rows=2)
    eng.backend.clock = lambda: wall0 + (time.perf_counter() - wall0) / 2  # half the wall's pace
    out = eng.run(_requests(prompts[:2], prompts[:2]))
    for o in out:
        assert 0.04 < o.result.compress_s <= o.result.prefill_s + 1e-9 <= o.result.device_s + 2e-9
