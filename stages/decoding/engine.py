"""The decoding engine the product uses: batched plain or prompt-lookup speculative decoding.

Contract: ``decode(engine, state, lookup_ids, config, seeds, decode_text)`` consumes
``state`` (its cache is mutated) and returns one RowResult per row, in order.
``engine`` (engine_state.EngineState, one per actor) holds the device's step backend
and what the engine has learned so far (step cost, acceptance); ``decode`` updates
it and keeps nothing else between calls. The engine knows nothing about
tokenization beyond ``decode_text`` (for stop strings).
``config.speculative == "none"`` runs the same loop with no drafts (one token per
row per step); greedy output is token-for-token that of reference.decode_plain.

Lookup source: ``lookup_ids[b]`` is the row's ORIGINAL prompt (prefix + full
document + query ids) even when the cache holds a compressed context (Finch) or
the model saw cut text (RAG/truncation); the output so far is appended as it grows.

Step: every active row has one emitted-but-unfed token ``last``. It drafts up to
``num_draft_tokens`` tokens (drafting.NgramIndex); adaptive.py picks the step width
T from each row's recent acceptance and the measured step cost; rows feed ``[last,
drafts]`` right-padded to T with per-row RoPE positions ``next_pos + 0..T-1``.
verify.py accepts a prefix of each row's drafts and emits one more token.

Step backend (backend.py): the forward of a step, the clock its cost is measured
with, and the cost model's prior are the device's. On CPU (cpu_backend.py) every
linear layer runs on the BLAS kernel measured fastest for its token count
(linear_plan.py), and the step-cost model uses the measured cost curve, so widths
that are nearly free on this machine get used.

Rollback and cache layout (kvbuffer.py): rejected drafts and padding stay in the
KV cache but are marked invalid in ``valid`` (holes) so nothing attends to them,
and positions advance only by accepted + 1, so each row's valid slots carry
consecutive positions. Slots invalid for every row at the end of the cache are
cropped at once (free: the cache is a buffer written in place); holes in the middle
are squeezed out by ``compact`` once they exceed ~1/8 of the cache. Finished rows
leave the batch (their cache rows are dropped), so they cost nothing afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from stages.decoding.adaptive import AcceptanceModel, DraftLengths, StepCost, Tuning, choose_width
from stages.decoding.config import DecodeConfig, RowResult
from stages.decoding.drafting import NgramIndex
from stages.decoding.engine_state import EngineState
from stages.decoding.kvbuffer import adopt, compact, keep_rows
from stages.decoding.sampling import make_generators, target_probs
from stages.decoding.state import PrefillState
from stages.decoding.stops import StopChecker
from stages.decoding.verify import accept_greedy, accept_sampled


def _check(engine: EngineState, state: PrefillState, lookup_ids: list[list[int]], config: DecodeConfig) -> None:
    if state.valid.device.type != engine.device.type:
        raise ValueError(f"the prefill state is on {state.valid.device}, the engine state on {engine.device}")
    if len(lookup_ids) != state.batch_size:
        raise ValueError(f"lookup_ids has {len(lookup_ids)} rows, the prefill state has {state.batch_size}")
    if config.speculative not in ("none", "prompt_lookup"):
        raise ValueError(f"speculative must be 'none' or 'prompt_lookup', got {config.speculative!r}")
    if config.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
    if config.speculative == "prompt_lookup" and config.num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {config.num_draft_tokens}")


@torch.inference_mode()
def decode(
    engine: EngineState,
    state: PrefillState,
    lookup_ids: list[list[int]],
    config: DecodeConfig,
    seeds: list[int] | None = None,
    decode_text: Callable[[list[int]], str] | None = None,
    tuning: Tuning | None = None,
) -> list[RowResult]:
    """Decode every row of ``state`` to its stop (see the module contract); updates ``engine``."""
    _check(engine, state, lookup_ids, config)
    tuning = tuning or Tuning()
    b = state.batch_size
    device = state.valid.device
    spec = config.speculative == "prompt_lookup"
    k_max = config.num_draft_tokens if spec else 0
    gens = make_generators(seeds or [0] * b, device)
    stopper = StopChecker(config.eos_ids, config.max_new_tokens, config.stop_strings, decode_text)
    results = [RowResult() for _ in range(b)]
    index = [NgramIndex(list(ids), config.max_ngram, config.min_ngram, tuning.prefer) for ids in lookup_ids] if spec else []  # noqa: E501
    lengths = DraftLengths(b, k_max, tuning)
    cost, acceptance, backend = engine.cost, engine.acceptance, engine.backend
    clock = backend.clock
    t0 = time.perf_counter()
    first_at = [0.0] * b

    def emit(r: int, toks: list[int]) -> bool:
        """Append tokens to row r (cut at a stop); True when the row finished."""
        res = results[r]
        start = len(res.tokens)
        res.tokens.extend(toks)
        keep, reason = stopper.scan(res.tokens, start)
        del res.tokens[keep:]
        now = time.perf_counter() - t0
        if start == 0:
            first_at[r] = now
            res.ttft_s = state.prefill_s + now
        if spec:
            index[r].extend(res.tokens[start:])
        if reason is None:
            return False
        res.finish_reason = reason
        res.decode_s = now - first_at[r]
        return True

    # The first token comes from the prefill's logits.
    if config.greedy:
        firsts = [[t] for t in state.last_logits.argmax(dim=-1).tolist()]
    else:
        probs0 = target_probs(state.last_logits, config.temperature, config.top_p)
        firsts = [accept_sampled([], probs0[r : r + 1], [], gens[r])[1] for r in range(b)]
    rows = [r for r in range(b) if not emit(r, firsts[r])]
    if not rows:
        return results

    cache, valid, pos = state.cache, state.valid, state.next_pos.clone()
    counts = valid.sum(dim=1).tolist()  # valid slots per cache row
    adopt(cache, reserve=config.max_new_tokens + valid.shape[1] // 8 + 2 * (k_max + 1))
    if len(rows) < b:
        sel = torch.tensor(rows, device=device)
        keep_rows(cache, sel)
        valid, pos, counts = valid[sel], pos[sel], [counts[r] for r in rows]
    arange = torch.arange(k_max + 1, device=device)

    while rows:
        n = len(rows)
        drafts, ngrams = (
            _drafts(rows, results, index, lengths, acceptance, cost, config, tuning) if spec else ([[]] * n, [])
        )
        width = 1 + max(len(d) for d in drafts)
        lens = [1 + len(d) for d in drafts]
        feed = torch.tensor(
            [[results[r].tokens[-1]] + d + [0] * (width - m) for r, d, m in zip(rows, drafts, lens, strict=True)],
            dtype=torch.long, device=device,
        )  # [n, T]
        cols = arange[:width]
        new_valid = cols[None] < torch.tensor(lens, device=device)[:, None]  # [n, T]
        pick = new_valid.flatten().nonzero().squeeze(1)  # [N] real fed slots
        t_step = clock()
        logits, valid = backend.forward(cache, valid, feed, pos[:, None] + cols[None], new_valid, pick)
        verdicts = _verify(logits, drafts, rows, config, gens)
        cost.observe(n * width, clock() - t_step)

        accepted = [a for a, _ in verdicts]
        acc_t = torch.tensor(accepted, device=device)
        valid[:, -width:] &= cols[None] <= acc_t[:, None]  # holes: rejected drafts, padding
        pos = pos + acc_t + 1
        keep = []
        for i, (r, (a, out)) in enumerate(zip(rows, verdicts, strict=True)):
            res = results[r]
            res.decode_steps += 1
            res.draft_tokens += len(drafts[i])
            res.accepted_tokens += a
            counts[i] += a + 1
            if spec:
                lengths.update(r, len(drafts[i]), a)
                acceptance.update(ngrams[i], len(drafts[i]), a)
            if not emit(r, out):
                keep.append(i)
        if not keep:
            break
        if len(keep) < n:
            sel = torch.tensor(keep, device=device)
            keep_rows(cache, sel)
            valid, pos = valid[sel], pos[sel]
            rows, counts = [rows[i] for i in keep], [counts[i] for i in keep]
            accepted = [accepted[i] for i in keep]
        # Slots past every kept row's last accepted token: drop them outright.
        tail = width - 1 - max(accepted)
        if tail > 0:
            cache.crop(-tail)
            valid = valid[:, :-tail]
        holes = valid.shape[1] - max(counts)
        if holes > 0 and holes >= max(tuning.compact_min_holes, tuning.compact_fraction * valid.shape[1]):
            valid = compact(cache, valid)
    return results


def _drafts(
    rows: list[int],
    results: list[RowResult],
    index: list[NgramIndex],
    lengths: DraftLengths,
    acceptance: AcceptanceModel,
    cost: StepCost,
    config: DecodeConfig,
    tuning: Tuning,
) -> tuple[list[list[int]], list[int]]:
    """Per active row, the drafts to feed this step and the suffix length they matched."""
    props, ngrams = [], []
    for r in rows:
        room = config.max_new_tokens - len(results[r].tokens) - 1  # the bonus token needs a slot
        draft, n = index[r].match(min(lengths.k_max, room))
        props.append(draft)
        ngrams.append(n)
    if not config.adaptive:
        return props, ngrams
    allowed = [min(len(p), lengths.allowed(r)) for r, p in zip(rows, props, strict=True)]
    remaining = [config.max_new_tokens - len(results[r].tokens) for r in rows]
    width = choose_width(allowed, ngrams, acceptance, cost, tuning.min_gain, remaining)
    # Padding slots up to the width are computed anyway: fill them with drafts.
    return [p[: width - 1] for p in props], ngrams


def _verify(
    logits: torch.Tensor,
    drafts: list[list[int]],
    rows: list[int],
    config: DecodeConfig,
    gens: list[torch.Generator],
) -> list[tuple[int, list[int]]]:
    """Accept per row from logits [N, V] (row i's slots are consecutive, 1 + len(drafts[i]))."""
    starts, s = [], 0
    for d in drafts:
        starts.append(s)
        s += 1 + len(d)
    if config.greedy:
        best = logits.argmax(dim=-1).tolist()
        return [accept_greedy(d, best[st : st + len(d) + 1]) for d, st in zip(drafts, starts, strict=True)]
    probs = target_probs(logits, config.temperature, config.top_p)  # [N, V]
    flat_rows = [st + j for d, st in zip(drafts, starts, strict=True) for j in range(len(d))]
    flat_toks = [t for d in drafts for t in d]
    p_draft = probs[flat_rows, flat_toks].tolist() if flat_rows else []
    out, k = [], 0
    for i, (d, st) in enumerate(zip(drafts, starts, strict=True)):
        m = len(d)
        out.append(accept_sampled(d, probs[st : st + m + 1], p_draft[k : k + m], gens[rows[i]]))
        k += m
    return out
