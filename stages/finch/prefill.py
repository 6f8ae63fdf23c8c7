"""Finch prefill: read each document in chunks, keep a fixed budget of KV entries.

Contract: ``finch_prefill(model, parts, config, pad_id)`` takes B prompts split by
``PromptParts`` and returns a ``CompressedPrefill`` whose state decodes with
``forward_step`` like any other prefill. For every layer and row the cache holds

    [ prefix (whole) ; kept document entries ; query P ]

where exactly ``min(target_tokens, len(doc))`` document entries are kept (at most that
many with ``min_relevance`` > 0 in mode kv), in
document order, at contiguous positions right after the prefix (keys re-rotated),
``next_pos`` is the position after P and ``last_logits`` predicts the first
answer token from that compressed cache.

Algorithm (Corallo & Papotti, TACL 2024, with every choice pinned):
1. Prefill the prefix (chat template up to "Document:") for all rows; it is kept
   whole, like an attention sink, and is not counted in the budget.
2. For chunk i (``chunk_tokens`` document tokens per row): feed the block
   ``[chunk_i ; P]`` on top of the cache, positions contiguous after the cache.
   The pass is the model's normal forward (SDPA), with one pre-hook per attention
   module projecting P's rows to queries (stages/kv/queries.py).
3. Score the kept entries and the chunk's entries by P's attention (strategies.py):
   scoring="paper" (the default) sums every head of each layer (softmax with the
   pass's causal mask, each prompt row weighted by its number of attended slots;
   head_mode="kv_group": per KV head); scoring="heads" (our variant) sums the
   calibrated retrieval heads' attention, each head normalised over the document,
   pooled over ``pool_window`` tokens, into one selection shared by all layers
   (evidence.py, heads.py).
4. Keep the top ``kept_i`` of them (schedule.py: ``floor(T * n_i / N)``, ending at
   exactly T), drop P's entries, restore document order and rotate the kept keys
   to contiguous positions (compaction.py, stages/kv/rope.py).
5. mode="kv": after the last chunk, prefill P on the compressed cache for
   ``last_logits``. mode="early_exit" (GemFilter, Shi et al. 2024): steps 2-4 run
   only the layers up to the deepest selecting head, and the kept document tokens
   are then prefilled with prefix and P through the whole model (a plain cache).
   When every document fits the budget, early exit is one full prefill.
   keep="sentences" in mode kv (scoring heads, one shared selection) ranks each
   candidate of every pass by its sentence's best score (evidence.pool_sentences),
   so the kept entries are whole sentences; min_relevance > 0 then drops, after the
   last pass, the sentences scoring below that fraction of the best one, next_sentence
   keeping the one after each (passes.drop_below_floor): the budget becomes a cap, the
   cache stays the kept KV. In early exit keep="sentences" widens the selection
   to whole sentences around the selected tokens before that prefill (spans.py), same budget;
   order="relevance" lays the kept runs (or sentences) out least relevant first,
   by the last pass's scores, so the best evidence ends next to the question, and
   min_relevance > 0 drops the runs (sentences) scoring below that fraction of the
   best one: the budget is a cap (order.py). evidence="fused" (keep sentences)
   instead scores every sentence of the document by the heads' best kept token and
   by an embedder's similarity to the question, and reads the best sentences that
   fit the budget, with the same floor and order (fusion.py): a question in other
   words than its answer's sentence still finds it.

Batching: rows have their own documents, budgets and schedules; blocks are
left-padded, a row whose document is exhausted rides along with an all-padding
block and keeps its entries unchanged. Memory: during a pass each layer holds at
most ``Lp + target + chunk + |P|`` slots (Lp, |P|: the batch's widest prefix and
query), asserted at every step; positions never exceed
``prefix + min(target + chunk, len(doc)) + |P|``, so documents far longer than the
model's context window work. Fused evidence adds one embedding vector per sentence
(384 floats with MiniLM; the embedder reads the sentences in batches) and no slots.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from stages.decoding.backends import synchronize
from stages.decoding.forward import cache_kwargs
from stages.decoding.state import (
    CompressedPrefill,
    PrefillState,
    forward_step,
    left_pad,
    positions_from_real,
    prefill_buckets,
    step_mask,
)
from stages.finch.fusion import (
    Similarity,
    choose_sentences,
    fuse,
    head_evidence,
    similarity_evidence,
)
from stages.finch.heads import HeadSet, check_heads, find_heads, heads_named
from stages.finch.order import lay_out
from stages.finch.passes import (
    FinchStep,
    Reading,
    drop_below_floor,
    first_layers,
    next_kept,
    prefill_prefix,
    record_step,
    select_and_compact,
)
from stages.finch.schedule import chunk_spans, kept_after_chunks
from stages.finch.shared import read_shared
from stages.finch.spans import Boundaries, sentence_index, sentence_spans, snap_to_sentences
from stages.finch.strategies import PassView, Selector, make_selector
from stages.finch.support import check_inputs, check_supported
from stages.kv.model_parts import attention_modules, decoder, rotary_module
from stages.kv.queries import QueryCapture
from stages.prompting import PromptParts

if TYPE_CHECKING:  # the spec model lives with its method; imported for types only
    from transformers import PreTrainedModel

    from stages.finch.config import FinchCompression

__all__ = ["FinchStep", "check_supported", "finch_prefill"]


@dataclass
class _Block:
    """One pass's input: per row ``[pad ; chunk_i ; P]`` (all padding once the row's
    document is exhausted). ids/real/is_chunk: [B, T]; p_real: [B, P] marks the real
    prompt tokens among the last ``p_rows`` columns; doc_index: [B, T] document
    index of each column (meaningful on chunk tokens only)."""

    ids: torch.Tensor
    real: torch.Tensor
    is_chunk: torch.Tensor
    p_rows: int
    p_real: torch.Tensor
    doc_index: torch.Tensor


def _block(parts: list[PromptParts], spans: list[list[tuple[int, int]]], i: int, pad_id: int,
           device: torch.device) -> _Block:
    """Chunk ``i`` of every row (``spans[row]``: its chunks' [start, end) in the document)
    followed by the row's query, left-padded into one block (``_Block``)."""
    rows, chunk_lens, p_lens, starts = [], [], [], []
    for p, sp in zip(parts, spans, strict=True):
        s, e = sp[i] if i < len(sp) else (0, 0)
        rows.append(p.context_ids[s:e] + p.query_ids if e > s else [])
        chunk_lens.append(e - s)
        p_lens.append(len(p.query_ids) if e > s else 0)
        starts.append(s)
    ids, real = left_pad(rows, pad_id, device)
    t = ids.shape[1]
    col = torch.arange(t, device=device)[None]  # [1, T]
    first = torch.tensor([t - len(r) for r in rows], device=device)[:, None]  # [B, 1]
    is_chunk = (col >= first) & (col < first + torch.tensor(chunk_lens, device=device)[:, None])
    p_rows = max(p_lens)
    p_start = t - torch.tensor(p_lens, device=device)[:, None]
    return _Block(
        ids=ids,
        real=real,
        is_chunk=is_chunk,
        p_rows=p_rows,
        p_real=col[:, t - p_rows :] >= p_start,
        doc_index=torch.tensor(starts, device=device)[:, None] + col - first,
    )


def _pass_view(capture: QueryCapture, cache: DynamicCache, mask: torch.Tensor, blk: _Block, lp: int,
               cand_valid: torch.Tensor) -> PassView:
    """What the selector sees of this pass (strategies.PassView). mask: [B, 1, T, S + T]
    (the pass's step mask); cand_valid: [B, C], the kept entries and the chunk."""
    return PassView(
        queries=capture.queries,
        keys=[layer.keys for layer in cache.layers],
        row_mask=mask[:, 0, mask.shape[2] - blk.p_rows :, :],  # [B, P, S + T]
        p_real=blk.p_real,
        lp=lp,
        cand_valid=cand_valid,
    )


def _kept_scores(index0: torch.Tensor, kept_score: torch.Tensor, kept: torch.Tensor) -> list[dict[int, float]]:
    """Per row, document index -> the last scoring pass's score of each kept token, in
    slot order (ascending document index). index0: [B, H_kv, K] (layer 0),
    kept_score: [B, K], kept: [B]."""
    out = []
    for row, k in enumerate(kept.tolist()):
        idx = index0[row, 0, index0.shape[-1] - int(k) :].tolist()
        out.append(dict(zip(idx, kept_score[row, kept_score.shape[-1] - int(k) :].tolist(), strict=True)))
    return out


_AUTO = object()


@torch.inference_mode()
def finch_prefill(
    model: PreTrainedModel,
    parts: list[PromptParts],
    config: FinchCompression,
    pad_id: int,
    trace: list[FinchStep] | None = None,
    heads: HeadSet | None | object = _AUTO,
    boundaries: Boundaries | None = None,
    similarity: Similarity | None = None,
    on_chunk: Callable[[], None] | None = None,
) -> CompressedPrefill:
    """Compress each row's document into ``min(target, len(doc))`` KV entries per layer.

    See the module docstring for the algorithm and the cache layout. ``trace``, when
    given, receives one ``FinchStep`` per chunk pass. ``heads``: the selecting heads
    for scoring="heads" (default: the model's calibrated set, ``find_heads``; None =
    uncalibrated, every head). ``boundaries``: the tokenizer's sentence boundaries, needed by
    ``keep: sentences`` (spans.sentence_boundaries; the method's load computes them).
    ``similarity``: the question-sentence similarity, needed by ``evidence: fused``
    (fusion.make_similarity; the method's load builds it with the embedder).
    ``on_chunk``: called after each chunk pass (the decode engine runs a step of its other
    rows there, so a long document's compression does not stall them); its time is not
    counted in ``compress_s``.
    """
    if config.keep == "sentences" and boundaries is None:
        raise ValueError("finch keep sentences needs the tokenizer's sentence-ending ids (boundaries)")
    if config.evidence == "fused" and similarity is None:
        raise ValueError("finch evidence fused needs a question-sentence similarity (an embedder)")
    check_supported(model)
    check_inputs(model, parts, config)
    t0 = time.perf_counter()
    device = model.device
    early = config.mode == "early_exit"
    if early and all(len(p.context_ids) <= config.target_tokens for p in parts):
        return _prefill_kept(model, parts, [list(range(len(p.context_ids))) for p in parts], pad_id, t0, 0.0)
    read = read_document(model, parts, config, pad_id, trace=trace, heads=heads, on_chunk=on_chunk,
                         boundaries=boundaries)
    compress_s = read.compress_s
    b = len(parts)
    if early:
        kept_tokens, spent = kept_text(parts, read, config, boundaries, similarity)
        del read  # the scoring cache goes before the kept text is prefilled
        return _prefill_kept(model, parts, kept_tokens, pad_id, t0, compress_s + spent)
    if config.relevance_floor > 0:  # whole sentences in mode kv (config.py): the budget is a cap
        fits = torch.tensor([len(p.context_ids) <= config.target_tokens for p in parts], device=device)
        read = drop_below_floor(read, config.relevance_floor, fits, rotary_module(model).inv_freq,
                                config.next_sentence)
    cache, valid, kept, prefix_len = read.cache, read.valid, read.kept, read.prefix_len
    ids, real = left_pad([p.query_ids for p in parts], pad_id, device)
    pos = positions_from_real(real, prefix_len + kept)
    logits, valid = forward_step(model, cache, valid, ids, pos, real, logits_to_keep=1)
    synchronize(device)  # prefill_s must include the queued kernels
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
        kept_positions=_kv_positions(read.doc_index0),
    )


def _kv_positions(index0: torch.Tensor) -> list[list[int]]:
    """Per row, the document positions whose entries layer 0 keeps, in any KV head
    (index0 [B, H_kv, K], -1 on invalid slots). Layer 0 stands for the cache: with a shared
    selection every layer keeps the same positions; with the paper's per-layer scoring the
    layers differ and layer 0's choice is what the evidence recall reads."""
    return [sorted({int(j) for j in row.reshape(-1).tolist() if j >= 0}) for row in index0]


def kept_text(parts: list[PromptParts], read: Reading, config: FinchCompression,
              boundaries: Boundaries | None, similarity: Similarity | None) -> tuple[list[list[int]], float]:
    """Early exit's choice of the text to re-read: per row, the document indices kept (in
    the order the model reads them), and the seconds the choice took. ``config``
    resolved; ``boundaries``/``similarity`` as finch_prefill takes them."""
    scores = _kept_scores(read.doc_index0, read.kept_score, read.kept)
    kept_tokens = [list(sc) for sc in scores]  # ascending document indices (slot order)
    if config.keep != "sentences":
        return [
            k if len(k) >= len(p.context_ids) else lay_out(k, None, sc, config.order, config.relevance_floor)
            for k, p, sc in zip(kept_tokens, parts, scores, strict=True)
        ], 0.0
    ts = time.perf_counter()
    join = config.sentence_split == "prose"
    spans = [sentence_spans(p.context_ids, boundaries, join_lines=join) for p in parts]
    if config.evidence == "fused":
        kept_tokens = _fused_text(parts, spans, scores, config, similarity)
    else:
        kept_tokens = _head_text(parts, spans, kept_tokens, read.kept.tolist(), scores, config)
    return kept_tokens, time.perf_counter() - ts


@torch.inference_mode()
def read_document(
    model: PreTrainedModel,
    parts: list[PromptParts],
    config: FinchCompression,
    pad_id: int,
    trace: list[FinchStep] | None = None,
    heads: HeadSet | None | object = _AUTO,
    on_chunk: Callable[[], None] | None = None,
    boundaries: Boundaries | None = None,
) -> Reading:
    """The chunked reading pass of every row (steps 1-4 of the module docstring), through
    the layers early exit needs (mode early_exit) or all of them (mode kv). ``reading:
    chunk`` reads each distinct document once for all its rows (shared.py). ``boundaries``:
    needed by ``keep: sentences`` in mode kv, whose passes rank whole sentences."""
    if heads is _AUTO:
        heads = None
        if config.scoring == "heads":
            heads = heads_named(config.heads_from) if config.heads_from else find_heads(model)
            if heads is not None:
                check_heads(model, heads)
    selector = make_selector(model, config, heads)  # type: ignore[arg-type]
    sentence_of = None
    if config.mode == "kv" and config.keep == "sentences":
        if boundaries is None:
            raise ValueError("finch keep sentences needs the tokenizer's sentence-ending ids (boundaries)")
        sentence_of = sentence_index(parts, boundaries, config.sentence_split == "prose", model.device)
    if config.reading == "chunk":
        read = read_shared(model, parts, config, pad_id, selector, trace=trace, on_chunk=on_chunk,
                           sentence_of=sentence_of)
    else:
        read = _read_kept(model, parts, config, pad_id, selector, trace=trace, on_chunk=on_chunk,
                          sentence_of=sentence_of)
    return replace(read, sentence_of=sentence_of)


def _read_kept(
    model: PreTrainedModel,
    parts: list[PromptParts],
    config: FinchCompression,
    pad_id: int,
    selector: Selector,
    trace: list[FinchStep] | None = None,
    on_chunk: Callable[[], None] | None = None,
    sentence_of: torch.Tensor | None = None,
) -> Reading:
    """The paper's reading: each chunk is read after its row's kept entries, with the row's
    question appended (one pass of [B, T + P] per chunk; the cache holds at most prefix +
    target + chunk + query slots per layer, asserted). ``sentence_of`` [B, N]: see
    passes.select_and_compact."""
    early = config.mode == "early_exit"
    device = model.device
    base = decoder(model)
    attn = attention_modules(model)
    inv_freq = rotary_module(model).inv_freq
    b = len(parts)
    run_layers = selector.run_layers if early else len(attn)
    cache = DynamicCache()
    with first_layers(base, run_layers):
        valid, prefix_len = prefill_prefix(base, cache, [p.prefix_ids for p in parts], pad_id, device)
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
    capture = QueryCapture(attn, [i for i in selector.capture_layers if i < run_layers])
    compress_s = 0.0
    h_kv = int(model.config.get_text_config().num_key_value_heads)
    # Document index held by each kept slot: every layer for the trace, layer 0 always
    # (early exit re-reads those tokens).
    doc_index = [torch.zeros((b, h_kv, 0), dtype=torch.long, device=device) for _ in range(run_layers)]
    kept_score = torch.zeros((b, 0), device=device)  # [B, K]: early exit's order needs it
    for i in range(max(len(s) for s in spans)):
        ts = time.perf_counter()
        blk = _block(parts, spans, i, pad_id, device)
        pos = positions_from_real(blk.real, prefix_len + kept)  # [B, T]
        mask = step_mask(valid, blk.real)  # [B, 1, T, S + T]
        with capture.capturing(blk.p_rows), first_layers(base, run_layers):
            base(input_ids=blk.ids, attention_mask=mask, position_ids=pos,
                 use_cache=True, **cache_kwargs(base, cache))
        slots = cache.layers[0].keys.shape[2]
        assert slots <= bound, f"Finch cache grew to {slots} slots, bound {bound}"
        new_kept = next_kept(schedules, kept, i)
        cand_valid = torch.cat([valid[:, lp:], blk.is_chunk], dim=1)  # [B, C]
        cand_pos = torch.cat([doc_pos, pos], dim=1)  # [B, C]
        view = _pass_view(capture, cache, mask, blk, lp, cand_valid)
        plan, kept_score = select_and_compact(
            selector, view, cache, new_kept, prefix_len, blk.is_chunk.any(dim=1), kept_score,
            cand_pos, inv_freq, early, doc_index, blk.doc_index, trace is not None, sentence_of,
        )
        if trace is not None:
            record_step(trace, i, slots, torch.cat([valid, blk.real], dim=1), new_kept, doc_index,
                        kept_score, early)
        valid = torch.cat([valid[:, :lp], plan.slot_valid], dim=1)
        doc_pos, kept = plan.new_pos, new_kept
        compress_s += time.perf_counter() - ts
        if on_chunk is not None:
            on_chunk()
    return Reading(cache, valid, prefix_len, kept, doc_index[0], kept_score, compress_s)


def _head_text(parts: list[PromptParts], spans: list[list[tuple[int, int]]], kept_tokens: list[list[int]],
               kept: list[int], scores: list[dict[int, float]], config: FinchCompression) -> list[list[int]]:
    """evidence heads: whole sentences around the heads' picks (spans.snap_to_sentences),
    laid out by order.lay_out. Per row: ``spans`` its sentences, ``kept_tokens`` the
    reading's kept document indices, ``kept`` how many, ``scores`` index -> score. A document that fits the budget is read whole, in order,
    as when every row fits: a row's text must not depend on its batch."""
    out = []
    for k, sp, n, sc, p in zip(kept_tokens, spans, kept, scores, parts, strict=True):
        if n >= len(p.context_ids):
            out.append(list(range(len(p.context_ids))))
            continue
        snapped = snap_to_sentences(k, sp, int(n), sc)
        out.append(lay_out(snapped, sp, sc, config.order, config.relevance_floor))
    return out


def _fused_text(parts: list[PromptParts], spans: list[list[tuple[int, int]]], scores: list[dict[int, float]],
                config: FinchCompression, similarity: Similarity) -> list[list[int]]:
    """evidence fused: sentences by the heads' and the embedder's evidence (fusion.py);
    arguments as ``_head_text``'s, ``similarity`` as finch_prefill takes it."""
    out: list[list[int] | None] = [None] * len(parts)
    todo = [r for r, p in enumerate(parts) if len(p.context_ids) > config.target_tokens]
    for r, p in enumerate(parts):
        if r not in todo:
            out[r] = list(range(len(p.context_ids)))
    if todo:
        views = similarity([parts[r] for r in todo], [spans[r] for r in todo])
        for r, view in zip(todo, views, strict=True):
            fused = fuse(head_evidence(spans[r], scores[r]), similarity_evidence(view.cosine, view.content),
                         config.similarity_weight)
            out[r] = choose_sentences(spans[r], fused, config.target_tokens, config.relevance_floor,
                                      config.order, view.follows if config.next_sentence else None)
    return [o if o is not None else [] for o in out]


def _prefill_kept(model: PreTrainedModel, parts: list[PromptParts], kept: list[list[int]], pad_id: int,
                  t0: float, compress_s: float) -> CompressedPrefill:
    """Early exit's second step: prefill ``prefix ; kept document tokens ; query`` through
    the whole model. kept[row]: document indices in the order they are prefilled (a
    layout may put them in relevance order); kept_positions reports them ascending."""
    prompts = [
        p.prefix_ids + [p.context_ids[j] for j in k] + p.query_ids
        for p, k in zip(parts, kept, strict=True)
    ]
    state = prefill_buckets(model, prompts, pad_id)  # the rows' kept text differs widely in length
    synchronize(model.device)
    state.prefill_s = time.perf_counter() - t0
    b = len(parts)
    return CompressedPrefill(state=state, context_tokens=[len(k) for k in kept],
                             compress_s=[compress_s / b] * b, kept_positions=[sorted(k) for k in kept],
                             prefilled_positions=[list(k) for k in kept])
