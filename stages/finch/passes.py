"""The pieces both Finch readings share (prefill.py's paper reading, shared.py's chunk
reading): the trace record, the prefix pass, the early-exit layer cut, the reading's result
and one pass's selection and compaction (step 4 of prefill.py's module docstring)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache

from stages.decoding.forward import cache_kwargs
from stages.decoding.state import left_pad, positions_from_real, step_mask
from stages.finch.compaction import entry_moves, gather_layer, make_plan, select_indices
from stages.finch.evidence import sentence_best
from stages.finch.strategies import PassView

__all__ = ["FinchStep", "Reading", "drop_below_floor", "first_layers", "next_kept", "prefill_prefix", "record_step",
           "select_and_compact"]


@dataclass(frozen=True)
class FinchStep:
    """One chunk pass, for tests and benchmarks: ``slots`` is the cache width per layer
    during the pass (block included), ``row_slots`` the valid slots per row then,
    ``kept`` the document entries per row after the step, ``kept_index[l]``
    [B, H_kv, K'] the document token index held by each kept slot of layer l
    (-1 on invalid slots), ``kept_score`` [B, K'] (early exit) the score of each kept
    slot of layer 0 in the latest scoring pass (-inf on invalid slots, 0 when no pass
    has scored yet)."""

    chunk: int
    slots: int
    row_slots: list[int]
    kept: list[int]
    kept_index: list[torch.Tensor]
    kept_score: torch.Tensor | None = None


def prefill_prefix(base, cache: DynamicCache, prefixes: list[list[int]], pad_id: int, device):
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
        use_cache=True,
        **cache_kwargs(base, cache),
    )
    return real, real.long().sum(dim=1)


def _follow(kept_doc: torch.Tensor, block_doc: torch.Tensor, idx: torch.Tensor, plan) -> torch.Tensor:
    """Document indices after a selection (trace only): kept_doc [B, Hkv, K],
    block_doc [B, T], idx [B, G, K']. Returns [B, Hkv, K'] with -1 on invalid slots."""
    b, h_kv, _ = kept_doc.shape
    t = block_doc.shape[1]
    cand = torch.cat([kept_doc, block_doc[:, None].expand(b, h_kv, t)], dim=2)
    picked = cand.gather(2, idx.expand(b, h_kv, idx.shape[-1]))
    return torch.where(plan.slot_valid[:, None], picked, -1)


def _follow_score(cand_score: torch.Tensor, idx: torch.Tensor, plan) -> torch.Tensor:
    """Scores of the kept slots: cand_score [B, C], idx [B, G, K'] -> [B, K'] (-inf on
    invalid slots)."""
    picked = cand_score.gather(1, idx[:, 0])
    return torch.where(plan.slot_valid, picked, float("-inf"))


def _carried(kept_score: torch.Tensor, cand_valid: torch.Tensor) -> torch.Tensor:
    """The kept slots' scores [B, K] widened to the candidates [B, C] (0 on the chunk)."""
    pad = cand_valid.shape[1] - kept_score.shape[1]
    return torch.cat([kept_score, kept_score.new_zeros(kept_score.shape[0], pad)], dim=1)


@contextmanager
def first_layers(base, n: int):
    """Run only the first ``n`` decoder layers of ``base`` inside the block (early exit)."""
    full = base.layers
    if n >= len(full):
        yield
        return
    base.layers = torch.nn.ModuleList(list(full)[:n])
    try:
        yield
    finally:
        base.layers = full


@dataclass
class Reading:
    """What a reading pass leaves (per row, B rows): ``cache`` [prefix | kept] per layer
    of the layers run, ``valid`` [B, Lp + K] its real slots, ``prefix_len`` [B] and
    ``kept`` [B] the real prefix and kept entries, ``doc_index0`` [B, H_kv, K] the
    document index held by each kept slot of layer 0 (-1 on invalid slots),
    ``kept_score`` [B, K] the last scoring pass's score of each kept slot (early exit, and
    keep sentences in mode kv), ``compress_s`` the pass's own seconds (on_chunk excluded),
    ``sentence_of`` [B, N] the sentence of each document index (keep sentences in mode kv;
    None otherwise)."""

    cache: DynamicCache
    valid: torch.Tensor
    prefix_len: torch.Tensor
    kept: torch.Tensor
    doc_index0: torch.Tensor
    kept_score: torch.Tensor
    compress_s: float
    sentence_of: torch.Tensor | None = None


def next_kept(schedules: list[list[int]], kept: torch.Tensor, i: int) -> torch.Tensor:
    """[B] entries each row keeps after chunk ``i`` (its schedule; unchanged once its
    document is exhausted)."""
    return torch.tensor(
        [s[i] if i < len(s) else int(k) for s, k in zip(schedules, kept.tolist(), strict=True)],
        device=kept.device,
    )


def select_and_compact(selector, view: PassView, cache: DynamicCache, new_kept: torch.Tensor,
                       prefix_len: torch.Tensor, scored: torch.Tensor, kept_score: torch.Tensor,
                       cand_pos: torch.Tensor, inv_freq: torch.Tensor, early: bool,
                       doc_index: list[torch.Tensor], block_doc: torch.Tensor, trace: bool,
                       sentence_of: torch.Tensor | None = None):
    """Step 4 of one pass, for both readings: rank the candidates (the kept entries and
    the chunk's, ``view.cand_valid`` [B, C]), keep ``new_kept`` [B] per row and rebuild
    each layer of ``cache`` as [prefix | kept] (re-rotated to contiguous positions).
    ``scored`` [B]: rows whose question scored in this pass (the others carry their
    scores). Updates ``doc_index`` in place (layer 0 always, every layer for a trace;
    ``block_doc`` [B, C - K] the document index of the non-kept candidates).
    ``sentence_of`` [B, N]: the sentence of each document index (keep sentences in mode
    kv, one selection for every layer); the selector then ranks whole sentences. Returns
    (plan, kept_score [B, K'])."""
    if sentence_of is not None:
        cand_doc = torch.cat([doc_index[0][:, 0], block_doc], dim=1)  # [B, C]
        top = sentence_of.shape[1] - 1
        view = replace(view, cand_sentence=sentence_of.gather(1, cand_doc.clamp(0, max(top, 0))))
    lp = view.lp
    cand_valid = view.cand_valid
    b = cand_valid.shape[0]
    plan = make_plan(new_kept, prefix_len)
    slots = cache.layers[0].keys.shape[2]
    # Rows keeping all their candidates (document shorter than the budget so
    # far) leave nothing to rank: skip the scoring matmuls when all rows do.
    if bool((new_kept == cand_valid.sum(dim=1)).all()):
        zeros = torch.zeros((b, 1, slots - lp), device=cand_valid.device)
        chosen = [select_indices(zeros, cand_valid, plan)] * len(cache.layers)
        kept_score = _follow_score(_carried(kept_score, cand_valid), chosen[0], plan)
    elif early or sentence_of is not None:
        # One shared selection whose scores the kept slots carry: early exit orders the kept
        # text by them, whole sentences in mode kv hold them for the relevance floor.
        scores = selector.scores(view)  # [B, 1, C]
        chosen = [select_indices(scores, cand_valid, plan)] * len(cache.layers)
        # A row without a chunk in this pass has no question in it either: it keeps
        # the scores of its last pass.
        fresh = torch.where(scored[:, None], scores[:, 0], _carried(kept_score, cand_valid))
        kept_score = _follow_score(fresh, chosen[0], plan)
    else:
        chosen = selector.select(view, plan)
    moves, moved_by = None, None
    for layer_idx, (layer, idx) in enumerate(zip(cache.layers, chosen, strict=True)):
        if trace or layer_idx == 0:
            doc_index[layer_idx] = _follow(doc_index[layer_idx], block_doc, idx, plan)
        if idx is not moved_by:  # layers sharing one selection share its rotation
            moves, moved_by = entry_moves(idx, cand_pos, plan, inv_freq), idx
        layer.keys, layer.values = gather_layer(layer.keys, layer.values, lp, idx, moves)
    return plan, kept_score


def drop_below_floor(read: Reading, floor: float, fits: torch.Tensor, inv_freq: torch.Tensor,
                     next_sentence: bool = False) -> Reading:
    """Mode kv with whole sentences and ``min_relevance`` > 0, after the last pass: drop the
    kept sentences whose best slot score is below ``floor`` x the row's best, so the
    answer's cache holds the sentences near the best one's relevance and ``target_tokens``
    is a cap. A sentence stays or goes whole (the slots' scores differ inside it by the
    tie-break only, evidence.pool_sentences). ``fits`` [B] bool: rows whose whole document
    fits the budget keep it whole (their scores may never have been computed, and a row's
    cache must not depend on its batch). ``next_sentence``: a kept sentence right after one
    that passes the floor stays too (an answer often follows the sentence naming its
    subject). Every layer is rebuilt as ``[prefix | kept']`` at contiguous positions (one
    selection serves every layer). Needs ``read.sentence_of`` and the slots' last scores
    ``kept_score`` [B, K] (select_and_compact tracks them with ``sentence_of``)."""
    assert read.sentence_of is not None, "the relevance floor in mode kv needs keep sentences"
    k = read.kept_score.shape[1]
    lp = read.valid.shape[1] - k
    slot_valid = read.valid[:, lp:]  # [B, K]
    score = read.kept_score.masked_fill(~slot_valid, float("-inf"))
    top = read.sentence_of.shape[1] - 1
    sentence = read.sentence_of.gather(1, read.doc_index0[:, 0].clamp(0, max(top, 0)))  # [B, K]
    if k:
        score = sentence_best(score[:, None], sentence, slot_valid)[:, 0]
    best = score.max(dim=1, keepdim=True).values if k else score.new_zeros(score.shape[0], 1)
    keep = slot_valid & (score >= floor * best)
    if next_sentence and k:
        passed = keep.new_zeros((keep.shape[0], top + 2), dtype=torch.long)
        passed.scatter_add_(1, sentence, keep.long())  # [B, N + 1]: kept slots per passing sentence
        after = (passed.gather(1, (sentence - 1).clamp(min=0)) > 0) & (sentence > 0)
        keep |= slot_valid & after
    keep |= slot_valid & fits[:, None]
    plan = make_plan(keep.sum(dim=1), read.prefix_len)
    idx = select_indices(score.masked_fill(~keep, float("-inf"))[:, None], keep, plan)  # [B, 1, K']
    # The kept slots sit at contiguous positions after the prefix (compaction.py), invalid first.
    rank = torch.arange(k, device=score.device)[None] - (k - read.kept)[:, None]  # [B, K]
    cand_pos = torch.where(slot_valid, read.prefix_len[:, None] + rank, 0)
    moves = entry_moves(idx, cand_pos, plan, inv_freq)  # one selection: one rotation for every layer
    for layer in read.cache.layers:
        layer.keys, layer.values = gather_layer(layer.keys, layer.values, lp, idx, moves)
    empty = read.doc_index0.new_zeros((read.doc_index0.shape[0], 0))
    return replace(
        read,
        valid=torch.cat([read.valid[:, :lp], plan.slot_valid], dim=1),
        kept=plan.kept,
        doc_index0=_follow(read.doc_index0, empty, idx, plan),
        kept_score=_follow_score(score, idx, plan),
    )


def record_step(trace: list[FinchStep], i: int, slots: int, pass_valid: torch.Tensor,
                new_kept: torch.Tensor, doc_index: list[torch.Tensor], kept_score: torch.Tensor,
                early: bool) -> None:
    """Append chunk pass ``i`` to ``trace``: ``pass_valid`` [B, S] the real slots of every row
    during the pass (block included)."""
    trace.append(FinchStep(i, slots, pass_valid.sum(dim=1).tolist(), new_kept.tolist(),
                           list(doc_index), kept_score if early else None))
