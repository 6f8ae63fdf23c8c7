"""Finch prefill: read each document in chunks, keep a fixed budget of KV entries.

Contract: ``finch_prefill(model, parts, config, pad_id)`` takes B prompts split by
``PromptParts`` and returns a ``CompressedPrefill`` whose state decodes with
``forward_step`` like any other prefill. For every layer and row the cache holds

    [ prefix (whole) ; kept document entries ; query P ]

where exactly ``min(target_tokens, len(doc))`` document entries are kept, in
document order, at contiguous positions right after the prefix (keys re-rotated),
``next_pos`` is the position after P and ``last_logits`` predicts the first
answer token from that compressed cache.

Algorithm (Corallo & Papotti, TACL 2024, with every choice pinned):
1. Prefill the prefix (chat template up to "Document:") for all rows; it is kept
   whole, like an attention sink, and is not counted in the budget.
2. For chunk i (``chunk_tokens`` document tokens per row): feed the block
   ``[chunk_i ; P]`` on top of the cache, positions contiguous after the cache.
   The pass is the model's normal forward (SDPA), with one pre-hook per attention
   module projecting P's rows to queries (scoring.py).
3. Per layer, score the kept entries and the chunk's entries by P's attention
   (softmax with the pass's causal mask, each row weighted by its number of
   attended slots, summed over P's rows and over heads (head_mode="sum") or over
   each KV head's query group (head_mode="kv_group", one selection per KV head)).
4. Keep the top ``kept_i`` of them (schedule.py: ``floor(T * n_i / N)``, ending at
   exactly T), drop P's entries, restore document order and rotate the kept keys
   to contiguous positions (select.py, rope.py).
5. After the last chunk, prefill P on the compressed cache for ``last_logits``.

Batching: rows have their own documents, budgets and schedules; blocks are
left-padded, a row whose document is exhausted rides along with an all-padding
block and keeps its entries unchanged. Memory: during a pass each layer holds at
most ``Lp + target + chunk + |P|`` slots (Lp, |P|: the batch's widest prefix and
query), asserted at every step; positions never exceed
``prefix + min(target + chunk, len(doc)) + |P|``, so documents far longer than the
model's context window work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from schemas.spec import FinchCompression
from stages.decoding.state import (
    CompressedPrefill,
    PrefillState,
    forward_step,
    left_pad,
    positions_from_real,
    step_mask,
)
from stages.finch.rope import rotary_module
from stages.finch.schedule import chunk_spans, kept_after_chunks
from stages.finch.scoring import QueryCapture, prompt_scores
from stages.finch.select import gather_layer, make_plan, select_indices
from stages.finch.support import attention_modules, check_supported, sliding_window
from stages.prompting import PromptParts

__all__ = ["FinchStep", "check_supported", "finch_prefill"]


@dataclass(frozen=True)
class FinchStep:
    """One chunk pass, for tests and benchmarks: ``slots`` is the cache width per layer
    during the pass (block included), ``row_slots`` the valid slots per row then,
    ``kept`` the document entries per row after the step, ``kept_index[l]``
    [B, H_kv, K'] the document token index held by each kept slot of layer l
    (-1 on invalid slots)."""

    chunk: int
    slots: int
    row_slots: list[int]
    kept: list[int]
    kept_index: list[torch.Tensor]


def _check_inputs(model, parts: list[PromptParts], config: FinchCompression) -> None:
    if not parts:
        raise ValueError("finch_prefill needs at least one prompt")
    if any(not p.query_ids for p in parts):
        raise ValueError("Finch needs non-empty query_ids (the prompt that scores the cache)")
    text = model.config.get_text_config()
    needed = max(
        len(p.prefix_ids)
        + min(config.target_tokens + config.chunk_tokens, len(p.context_ids))
        + len(p.query_ids)
        for p in parts
    )
    limit = getattr(text, "max_position_embeddings", None)
    if limit is not None and needed > limit:
        raise ValueError(
            f"Finch cache needs {needed} positions (prefix + target_tokens "
            f"{config.target_tokens} + chunk_tokens {config.chunk_tokens} + query), more than "
            f"the model's context window {limit}; lower target_tokens or chunk_tokens"
        )
    window = sliding_window(text)
    if window is not None and needed > window:
        raise ValueError(
            f"Finch cache needs {needed} slots but the model attends within a sliding window "
            f"of {window}; lower target_tokens or chunk_tokens"
        )


def _prefill_prefix(base, cache: DynamicCache, prefixes: list[list[int]], pad_id: int, device):
    """Feed the left-padded prefixes. Returns (valid [B, Lp] bool, prefix_len [B] long)."""
    b = len(prefixes)
    if max(len(p) for p in prefixes) == 0:
        return torch.zeros((b, 0), dtype=torch.bool, device=device), torch.zeros(
            b, dtype=torch.long, device=device
        )
    ids, real = left_pad(prefixes, pad_id, device)
    empty = torch.zeros((b, 0), dtype=torch.bool, device=device)
    base(
        input_ids=ids,
        attention_mask=step_mask(empty, real),
        position_ids=positions_from_real(real),
        past_key_values=cache,
        use_cache=True,
    )
    return real, real.long().sum(dim=1)


def _block(parts: list[PromptParts], spans: list[list[tuple[int, int]]], i: int):
    """Rows' block token lists for chunk i and their (chunk length, query length)."""
    blocks, chunk_lens, p_lens = [], [], []
    for p, sp in zip(parts, spans, strict=True):
        if i < len(sp):
            s, e = sp[i]
            blocks.append(p.context_ids[s:e] + p.query_ids)
            chunk_lens.append(e - s)
            p_lens.append(len(p.query_ids))
        else:  # document exhausted: an all-padding block
            blocks.append([])
            chunk_lens.append(0)
            p_lens.append(0)
    return blocks, chunk_lens, p_lens


@torch.inference_mode()
def finch_prefill(
    model,
    parts: list[PromptParts],
    config: FinchCompression,
    pad_id: int,
    trace: list[FinchStep] | None = None,
) -> CompressedPrefill:
    """Compress each row's document into ``min(target, len(doc))`` KV entries per layer.

    See the module docstring for the algorithm and the cache layout. ``trace``, when
    given, receives one ``FinchStep`` per chunk pass.
    """
    check_supported(model)
    _check_inputs(model, parts, config)
    t0 = time.perf_counter()
    device = model.device
    base = getattr(model, model.base_model_prefix)
    attn = attention_modules(model)
    inv_freq = rotary_module(model).inv_freq
    b = len(parts)
    cache = DynamicCache()
    valid, prefix_len = _prefill_prefix(base, cache, [p.prefix_ids for p in parts], pad_id, device)
    lp = valid.shape[1]
    bound = lp + config.target_tokens + config.chunk_tokens + max(len(p.query_ids) for p in parts)
    spans = [chunk_spans(len(p.context_ids), config.chunk_tokens) for p in parts]
    schedules = [
        kept_after_chunks(len(p.context_ids), config.target_tokens, config.chunk_tokens)
        if p.context_ids
        else []
        for p in parts
    ]
    kept = torch.zeros(b, dtype=torch.long, device=device)  # [B]
    doc_pos = torch.zeros((b, 0), dtype=torch.long, device=device)  # [B, K]
    capture = QueryCapture(attn)
    compress_s = 0.0
    h_kv = int(model.config.get_text_config().num_key_value_heads)
    doc_index = [torch.zeros((b, h_kv, 0), dtype=torch.long, device=device) for _ in attn]
    for i in range(max(len(s) for s in spans)):
        ts = time.perf_counter()
        blocks, chunk_lens, p_lens = _block(parts, spans, i)
        ids, real = left_pad(blocks, pad_id, device)  # [B, T]
        t = ids.shape[1]
        offsets = torch.arange(t, device=device)[None]
        start = torch.tensor([t - len(x) for x in blocks], device=device)[:, None]
        clen = torch.tensor(chunk_lens, device=device)[:, None]
        is_chunk = (offsets >= start) & (offsets < start + clen)  # [B, T]
        pos = positions_from_real(real, prefix_len + kept)  # [B, T]
        mask = step_mask(valid, real)  # [B, 1, T, S + T]
        p_rows = max(p_lens)
        with capture.capturing(p_rows):
            base(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        slots = cache.layers[0].keys.shape[2]
        assert slots <= bound, f"Finch cache grew to {slots} slots, bound {bound}"
        new_kept = torch.tensor(
            [s[i] if i < len(s) else int(k) for s, k in zip(schedules, kept.tolist(), strict=True)],
            device=device,
        )
        plan = make_plan(new_kept, prefix_len)
        cand_valid = torch.cat([valid[:, lp:], is_chunk], dim=1)  # [B, C]
        cand_pos = torch.cat([doc_pos, pos], dim=1)  # [B, C]
        row_mask = mask[:, 0, t - p_rows :, :]  # [B, P, S + T]
        p_real = offsets[:, t - p_rows :] >= (t - torch.tensor(p_lens, device=device))[:, None]
        # Every row keeping all its candidates (document shorter than the budget so
        # far) leaves nothing to rank: skip the scoring matmuls.
        no_choice = bool((new_kept == cand_valid.sum(dim=1)).all())
        for layer_idx, layer in enumerate(cache.layers):
            if no_choice:
                scores = torch.zeros((b, 1, slots - lp), device=device)
            else:
                scores = prompt_scores(
                    capture.queries[layer_idx], layer.keys, row_mask, p_real,
                    attn[layer_idx].scaling, config.head_mode,
                )[:, :, lp:]
            idx = select_indices(scores, cand_valid, plan)
            if trace is not None:  # follow document token indices through the selection
                chunk_doc = (i * config.chunk_tokens + offsets - start).expand(b, t)
                cand_doc = torch.cat([doc_index[layer_idx], chunk_doc[:, None].expand(b, h_kv, t)], 2)
                picked = cand_doc.gather(2, idx.expand(b, h_kv, idx.shape[-1]))
                doc_index[layer_idx] = torch.where(plan.slot_valid[:, None], picked, -1)
            layer.keys, layer.values = gather_layer(
                layer.keys, layer.values, lp, idx, cand_pos, plan, inv_freq
            )
        if trace is not None:
            row_slots = torch.cat([valid, real], dim=1).sum(dim=1).tolist()
            trace.append(FinchStep(i, slots, row_slots, new_kept.tolist(), list(doc_index)))
        valid = torch.cat([valid[:, :lp], plan.slot_valid], dim=1)
        doc_pos, kept = plan.new_pos, new_kept
        compress_s += time.perf_counter() - ts
    ids, real = left_pad([p.query_ids for p in parts], pad_id, device)
    pos = positions_from_real(real, prefix_len + kept)
    logits, valid = forward_step(model, cache, valid, ids, pos, real, logits_to_keep=1)
    state = PrefillState(
        cache=cache,
        valid=valid,
        next_pos=prefix_len + kept + real.long().sum(dim=1),
        last_logits=logits[:, -1, :],
        prefill_s=time.perf_counter() - t0,
    )
    return CompressedPrefill(
        state=state,
        context_tokens=kept.tolist(),
        compress_s=[compress_s / b] * b,
    )
