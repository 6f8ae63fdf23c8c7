"""The decoding engine the product uses: batched plain or prompt-lookup speculative decoding.

Contract: ``decode(model, state, lookup_ids, config, seeds, decode_text)`` consumes
``state`` (its cache is mutated) and returns one RowResult per row, in order. The
engine knows nothing about tokenization beyond ``decode_text`` (for stop strings).

Lookup source: ``lookup_ids[b]`` is the row's ORIGINAL prompt (prefix + full
document + query ids) even when the cache holds a compressed context (Finch) or
the model saw cut text (RAG/truncation); the output so far is appended as it grows.

Step: every active row has one emitted-but-unfed token ``last``. It drafts up to
``k_b`` tokens (prompt lookup, ``drafting.NgramIndex``) and feeds ``[last, drafts]``;
rows are right-padded to the step's width T. The verify pass yields logits for
each fed slot; the accepted drafts plus one bonus token are emitted.

Rollback (holes): rejected drafts and padding stay in the KV cache but are marked
invalid in ``valid`` so no later token attends to them. RoPE positions advance only
by accepted + 1 per row, so a row's valid slots always carry consecutive positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from stages.decoding.config import DecodeConfig, RowResult
from stages.decoding.drafting import NgramIndex
from stages.decoding.sampling import make_generators, sample_from, target_probs
from stages.decoding.state import PrefillState, forward_step
from stages.decoding.stops import StopChecker


@torch.inference_mode()
def decode(
    model,
    state: PrefillState,
    lookup_ids: list[list[int]],
    config: DecodeConfig,
    seeds: list[int] | None = None,
    decode_text: Callable[[list[int]], str] | None = None,
) -> list[RowResult]:
    b = state.batch_size
    if len(lookup_ids) != b:
        raise ValueError(f"lookup_ids has {len(lookup_ids)} rows, the prefill state has {b}")
    if config.speculative not in ("none", "prompt_lookup"):
        raise ValueError(f"speculative must be 'none' or 'prompt_lookup', got {config.speculative!r}")
    device = state.valid.device
    spec = config.speculative == "prompt_lookup"
    gens = make_generators(seeds or [0] * b, device)
    stopper = StopChecker(config.eos_ids, config.max_new_tokens, config.stop_strings, decode_text)
    results = [RowResult() for _ in range(b)]
    index = [NgramIndex(list(ids), config.max_ngram, config.min_ngram) for ids in lookup_ids] if spec else []
    t0 = time.perf_counter()
    first_at = [0.0] * b

    def emit(r: int, toks: list[int]) -> bool:
        """Append tokens to row r; True when the row finished."""
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
        if reason is not None:
            res.finish_reason = reason
            res.decode_s = now - first_at[r]
            return True
        return False

    # First token from the prefill logits.
    logits0 = state.last_logits
    if config.greedy:
        firsts = logits0.argmax(dim=-1).tolist()
    else:
        probs0 = target_probs(logits0, config.temperature, config.top_p)
        firsts = [sample_from(probs0[r], gens[r]) for r in range(b)]
    rows = [r for r in range(b) if not emit(r, [firsts[r]])]

    cache, valid, pos = state.cache, state.valid, state.next_pos.clone()
    k = config.num_draft_tokens
    while rows:
        drafts = [index[r].propose(k) if spec else [] for r in rows]
        width = 1 + max(len(d) for d in drafts)
        n = len(rows)
        feed = torch.zeros((valid.shape[0], width), dtype=torch.long, device=device)
        new_valid = torch.zeros((valid.shape[0], width), dtype=torch.bool, device=device)
        for i, r in enumerate(rows):
            seq = [results[r].tokens[-1]] + drafts[i]
            feed[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            new_valid[i, : len(seq)] = True
            results[r].decode_steps += 1
            results[r].draft_tokens += len(drafts[i])
        positions = pos[:, None] + torch.arange(width, device=device)[None]
        logits, valid = forward_step(model, cache, valid, feed, positions, new_valid)
        accepted = [0] * n
        still = []
        for i, r in enumerate(rows):
            d = drafts[i]
            if config.greedy:
                best = logits[i, : len(d) + 1].argmax(dim=-1).tolist()
                a = 0
                while a < len(d) and d[a] == best[a]:
                    a += 1
                out = d[:a] + [best[a]]
            else:
                probs = target_probs(logits[i, : len(d) + 1], config.temperature, config.top_p)
                a, out = 0, []
                while a < len(d):
                    u = torch.rand((), generator=gens[r], device=device)
                    if float(u) < float(probs[a, d[a]]):
                        out.append(d[a])
                        a += 1
                        continue
                    rest = probs[a].clone()
                    rest[d[a]] = 0.0
                    out.append(sample_from(rest / rest.sum(), gens[r]))
                    break
                else:
                    out.append(sample_from(probs[a], gens[r]))
            accepted[i] = a
            results[r].accepted_tokens += a
            if not emit(r, out):
                still.append(i)
        acc = torch.tensor(accepted, device=device)
        # Holes: slots beyond last+accepted drafts become invalid.
        keep_cols = torch.arange(width, device=device)[None] <= acc[:, None]
        valid[:, -width:] &= keep_cols
        pos = pos + acc + 1
        if len(still) < n:
            sel = torch.tensor(still, dtype=torch.long, device=device)
            for layer in cache.layers:
                layer.batch_select_indices(sel)
            valid, pos = valid[sel], pos[sel]
            rows = [rows[i] for i in still]
    return results
