"""Reading a document once for all its questions: Finch's ``reading: chunk``.

Why: in the paper's reading (prefill.py ``_read_kept``) each chunk is read after the
entries its question kept so far, so a chunk's keys and values depend on the question
and a document asked three questions is read three times. Here a chunk is read after
the prompt's prefix only (question-independent, like an attention sink plus the chunk
itself), so its keys and values are computed once per document and every question of
that document scores the same chunk in its own small pass. The result for a row does
not depend on which other rows share its call: one call with a document's Q questions
equals Q calls with one question each (tests/stages/finch/test_shared.py).

Per chunk i, two passes through the layers the reading needs:
1. The document pass, G rows (the distinct documents of the call): ``[pad ; chunk_i]``
   on top of the documents' prefix cache and their context (``chunk_context``: the
   document's last N tokens before the chunk, whose entries the previous pass left; by
   default one chunk in mode kv, none in early exit: config.reading_context), positions
   right after them. Its keys and values are taken out and the
   document cache is cut back to the prefix and the new context (the last N slots).
2. The question pass, B rows (one per request): each row's cache is
   ``[prefix | kept_q | chunk_i]``, the chunk's keys rotated by kept_q - N so the layout
   is the paper's (kept entries, then the chunk, contiguous); the block is the
   row's question P alone, whose captured queries score the kept entries and the
   chunk (strategies.py). It runs only the layers the selection reads (every layer
   for the paper's scoring; up to the deepest selecting head for heads scoring, in
   mode kv too): P's entries are dropped after it, so the deeper layers' caches stay
   ``[prefix | kept_q | chunk_i]``. Selection and compaction are the paper reading's
   (passes.select_and_compact).
Cost: the chunk's tokens go through the model once per document (G x T tokens), the
questions once per row (B x |P|, small). Memory: the document cache holds
``Lp + N + T`` slots per layer and document; each row's ``Lp + target + T + |P|``, the
paper reading's bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from stages.decoding.forward import cache_kwargs
from stages.decoding.state import left_pad, positions_from_real, step_mask
from stages.finch.passes import (
    FinchStep,
    Reading,
    first_layers,
    next_kept,
    prefill_prefix,
    record_step,
    select_and_compact,
)
from stages.finch.schedule import chunk_spans, kept_after_chunks
from stages.finch.strategies import PassView, Selector
from stages.kv.model_parts import attention_modules, decoder, rotary_module
from stages.kv.queries import QueryCapture
from stages.kv.rope import rotate_by, rotation
from stages.prompting import PromptParts

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from stages.finch.config import FinchCompression


def document_groups(parts: list[PromptParts]) -> tuple[list[int], list[int]]:
    """(row -> document index, document -> its first row): rows with the same prefix and
    document share a document."""
    first: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    row_doc, doc_row = [], []
    for r, p in enumerate(parts):
        key = (tuple(p.prefix_ids), tuple(p.context_ids))
        if key not in first:
            first[key] = len(doc_row)
            doc_row.append(r)
        row_doc.append(first[key])
    return row_doc, doc_row


def _cut(x: torch.Tensor, lp: int, width: int, move: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """A document cache tensor [G, Hkv, S, D] cut back to its prefix and last ``width`` slots,
    those rotated by ``move`` (keys; a [G, 1, 1, D] rotation) when given."""
    if not width:
        return x[:, :, :lp]
    tail = x[:, :, x.shape[2] - width:]
    return torch.cat([x[:, :, :lp], rotate_by(tail, *move) if move is not None else tail], dim=2)


@torch.inference_mode()
def read_shared(
    model: PreTrainedModel,
    parts: list[PromptParts],
    config: FinchCompression,
    pad_id: int,
    selector: Selector,
    trace: list[FinchStep] | None = None,
    on_chunk: Callable[[], None] | None = None,
    sentence_of: torch.Tensor | None = None,
) -> Reading:
    """The chunk reading of every row, each distinct document read once (module docstring).
    ``sentence_of`` [B, N]: see passes.select_and_compact."""
    early = config.mode == "early_exit"
    device = model.device
    base = decoder(model)
    attn = attention_modules(model)
    inv_freq = rotary_module(model).inv_freq
    run_layers = selector.run_layers if early else len(attn)
    row_doc, doc_row = document_groups(parts)
    docs = [parts[r] for r in doc_row]
    b = len(parts)
    by_row = torch.tensor(row_doc, dtype=torch.long, device=device)  # [B]
    doc_cache = DynamicCache()
    with first_layers(base, run_layers):
        d_valid, d_prefix_len = prefill_prefix(base, doc_cache, [p.prefix_ids for p in docs], pad_id, device)
    lp = d_valid.shape[1]
    # The documents' context before the chunk (chunk_context): [G, C] real slots, [G] how many.
    ctx_valid = torch.zeros((len(docs), 0), dtype=torch.bool, device=device)
    ctx_len = torch.zeros(len(docs), dtype=torch.long, device=device)
    # Each row starts from its document's prefix entries.
    cache = DynamicCache()
    for layer in range(run_layers):
        if lp:
            k, v = doc_cache.layers[layer].keys, doc_cache.layers[layer].values
            cache.update(k.index_select(0, by_row), v.index_select(0, by_row), layer)
    valid, prefix_len = d_valid.index_select(0, by_row), d_prefix_len.index_select(0, by_row)
    bound = lp + config.target_tokens + config.chunk_tokens + max(len(p.query_ids) for p in parts)
    spans = [chunk_spans(len(p.context_ids), config.chunk_tokens) for p in docs]
    schedules = [
        kept_after_chunks(len(p.context_ids), config.target_tokens, config.chunk_tokens) if p.context_ids else []
        for p in parts
    ]
    kept = torch.zeros(b, dtype=torch.long, device=device)  # [B]
    doc_pos = torch.zeros((b, 0), dtype=torch.long, device=device)  # [B, K]
    capture = QueryCapture(attn, [i for i in selector.capture_layers if i < run_layers])
    h_kv = int(model.config.get_text_config().num_key_value_heads)
    doc_index = [torch.zeros((b, h_kv, 0), dtype=torch.long, device=device) for _ in range(run_layers)]
    kept_score = torch.zeros((b, 0), device=device)  # [B, K]
    compress_s = 0.0
    for i in range(max(len(s) for s in spans)):
        ts = time.perf_counter()
        # 1. The document pass: each distinct document's chunk, after its prefix.
        rows, starts = [], []
        for p, sp in zip(docs, spans, strict=True):
            s, e = sp[i] if i < len(sp) else (0, 0)
            rows.append(p.context_ids[s:e])
            starts.append(s)
        d_ids, d_real = left_pad(rows, pad_id, device)  # [G, T]
        t = d_ids.shape[1]
        d_pos = positions_from_real(d_real, d_prefix_len + ctx_len)  # [G, T]
        with first_layers(base, run_layers):
            base(input_ids=d_ids, attention_mask=step_mask(torch.cat([d_valid, ctx_valid], dim=1), d_real),
                 position_ids=d_pos, use_cache=True, **cache_kwargs(base, doc_cache))
        c = ctx_valid.shape[1]
        # 2. Each row's cache gets its document's chunk, moved from after the document's
        # context to after the row's kept entries.
        delta = kept - ctx_len.index_select(0, by_row)  # [B]
        moved = bool(delta.any())  # one host sync per pass, not one per layer
        # Every layer moves a row's chunk by the same distance: one [B, 1, 1, D] rotation.
        move = rotation(delta[:, None, None], inv_freq) if moved else None
        # The next chunk's context: the last N slots of [context | chunk] (a document's chunk
        # is left-padded only when it is its last one, so a continuing document's are real),
        # moved back to start right after the prefix, so the positions a document's passes use
        # stay within Lp + N + T however long the document.
        width = min(config.reading_context, c + t)
        next_valid = torch.cat([ctx_valid, d_real], dim=1)[:, c + t - width:]  # [G, width]
        next_len = next_valid.long().sum(dim=1)  # [G]
        back = ctx_len + d_real.long().sum(dim=1) - next_len  # [G] positions the kept context moves back
        unshift = rotation(-back[:, None, None], inv_freq) if bool(back.any()) else None
        for layer_idx in range(run_layers):
            dl = doc_cache.layers[layer_idx]
            ck = dl.keys[:, :, lp + c:].index_select(0, by_row)  # [B, Hkv, T, D]
            cv = dl.values[:, :, lp + c:].index_select(0, by_row)
            dl.keys, dl.values = _cut(dl.keys, lp, width, unshift), _cut(dl.values, lp, width)
            if move is not None:
                ck = rotate_by(ck, *move)
            if layer_idx < len(cache.layers):
                ql = cache.layers[layer_idx]
                ql.keys, ql.values = torch.cat([ql.keys, ck], dim=2), torch.cat([ql.values, cv], dim=2)
            else:  # no prefix: the chunk is the first thing in the cache
                cache.update(ck, cv, layer_idx)
        ctx_valid, ctx_len = next_valid, next_len
        chunk_real = d_real.index_select(0, by_row)  # [B, T]
        scored = chunk_real.any(dim=1)  # [B]: rows whose document has a chunk i
        chunk_pos = positions_from_real(chunk_real, prefix_len + kept)  # [B, T]
        # The question pass: P alone, on [prefix | kept | chunk].
        q_rows = [p.query_ids if bool(scored[r]) else [] for r, p in enumerate(parts)]
        p_ids, p_real = left_pad(q_rows, pad_id, device)  # [B, P]
        p_rows = p_ids.shape[1]
        past_valid = torch.cat([valid, chunk_real], dim=1)  # [B, Lp + K + T]
        p_pos = positions_from_real(p_real, prefix_len + kept + chunk_real.long().sum(dim=1))
        mask = step_mask(past_valid, p_real)  # [B, 1, P, S]
        # Only the selecting layers: P's own entries are dropped after the selection, so the
        # layers past the deepest selecting head (heads scoring) need nothing from P.
        with capture.capturing(p_rows), first_layers(base, selector.run_layers):
            base(input_ids=p_ids, attention_mask=mask, position_ids=p_pos,
                 use_cache=True, **cache_kwargs(base, cache))
        slots = cache.layers[0].keys.shape[2]
        assert slots <= bound, f"Finch cache grew to {slots} slots, bound {bound}"
        new_kept = next_kept(schedules, kept, i)
        cand_valid = torch.cat([valid[:, lp:], chunk_real, torch.zeros_like(p_real)], dim=1)  # [B, C]
        cand_pos = torch.cat([doc_pos, chunk_pos, p_pos], dim=1)  # [B, C]
        view = PassView(queries=capture.queries, keys=[layer.keys for layer in cache.layers],
                        row_mask=mask[:, 0], p_real=p_real, lp=lp, cand_valid=cand_valid)
        col = torch.arange(t, device=device)[None]  # [1, T]
        first = t - torch.tensor([len(r) for r in rows], device=device)[:, None]  # [G, 1]
        chunk_doc = (torch.tensor(starts, device=device)[:, None] + col - first).index_select(0, by_row)
        block_doc = torch.cat([chunk_doc, torch.zeros_like(p_pos)], dim=1)  # [B, T + P]
        plan, kept_score = select_and_compact(
            selector, view, cache, new_kept, prefix_len, scored, kept_score, cand_pos, inv_freq,
            early, doc_index, block_doc, trace is not None, sentence_of,
        )
        if trace is not None:
            record_step(trace, i, slots, torch.cat([past_valid, p_real], dim=1), new_kept, doc_index,
                        kept_score, early)
        valid = torch.cat([valid[:, :lp], plan.slot_valid], dim=1)
        doc_pos, kept = plan.new_pos, new_kept
        compress_s += time.perf_counter() - ts
        if on_chunk is not None:
            on_chunk()
    return Reading(cache, valid, prefix_len, kept, doc_index[0], kept_score, compress_s)
