"""Plain batched decoding, one token per forward pass: the reference every faster
decoder must agree with token for token under greedy decoding.

Contract: ``decode_plain(model, state, config, seeds, decode)`` consumes ``state``
(its cache grows) and returns one RowResult per row. Finished rows keep riding in
the batch as padding (their new slots are invalid) until every row is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from stages.decoding.config import DecodeConfig, RowResult
from stages.decoding.sampling import make_generators, sample_from, target_probs
from stages.decoding.state import PrefillState, forward_step
from stages.decoding.stops import StopChecker


def choose_tokens(
    logits: torch.Tensor, config: DecodeConfig, gens: list[torch.Generator], rows: list[int]
) -> list[int]:
    """Next token for each row in ``rows`` from logits [B, V]."""
    if config.greedy:
        best = logits.argmax(dim=-1)
        return [int(best[r]) for r in rows]
    probs = target_probs(logits, config.temperature, config.top_p, config.top_k)
    return [sample_from(probs[r], gens[r]) for r in rows]


@torch.inference_mode()
def decode_plain(
    model,
    state: PrefillState,
    config: DecodeConfig,
    seeds: list[int] | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> list[RowResult]:
    b = state.batch_size
    device = state.valid.device
    gens = make_generators(seeds or [0] * b, device)
    stopper = StopChecker(config.eos_ids, config.max_new_tokens, config.stop_strings, decode, config.repeat_ngram)
    results = [RowResult() for _ in range(b)]
    active = list(range(b))
    t0 = time.perf_counter()
    logits, valid, pos, cache = state.last_logits, state.valid, state.next_pos.clone(), state.cache
    first_token_at = [0.0] * b
    while True:
        picks = choose_tokens(logits, config, gens, active)
        now = time.perf_counter() - t0
        still = []
        for r, tok in zip(active, picks):
            res = results[r]
            res.tokens.append(tok)
            if len(res.tokens) == 1:
                first_token_at[r] = now
                res.ttft_s = state.prefill_s + now
            keep, reason = stopper.scan(res.tokens, len(res.tokens) - 1)
            del res.tokens[keep:]  # a repeat stop drops the repeated tokens
            if reason is None:
                still.append(r)
            else:
                res.finish_reason = reason
                res.decode_s = now - first_token_at[r]
        active = still
        if not active:
            return results
        feed = torch.zeros((b, 1), dtype=torch.long, device=device)
        new_valid = torch.zeros((b, 1), dtype=torch.bool, device=device)
        for r in active:
            feed[r, 0] = results[r].tokens[-1]
            new_valid[r, 0] = True
            results[r].decode_steps += 1
        step_logits, valid = forward_step(model, cache, valid, feed, pos[:, None], new_valid)
        logits = step_logits[:, -1, :]
        pos = pos + new_valid[:, 0].long()
