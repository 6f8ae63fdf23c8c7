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
from stages.finch.compaction import gather_layer, make_plan, select_indices
from stages.finch.strategies import PassView

__all__ = ["FinchStep", "Reading", "first_layers", "next_kept", "prefill_prefix", "record_step", "select_and_compact"]


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
    ``kept_score`` [B, K] the last scoring pass's score of each kept slot (early exit),
    ``compress_s`` the pass's own seconds (on_chunk excluded)."""

    cache: DynamicCache
    valid: torch.Tensor
    prefix_len: torch.Tensor
    kept: torch.Tensor
    doc_index0: torch.Tensor
    kept_score: torch.Tensor
    compress_s: float


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
    elif early:  # one shared selection; its scores order the kept text
        scores = selector.scores(view)  # [B, 1, C]
        chosen = [select_indices(scores, cand_valid, plan)] * len(cache.layers)
        # A row without a chunk in this pass has no question in it either: it keeps
        # the scores of its last pass.
        fresh = torch.where(scored[:, None], scores[:, 0], _carried(kept_score, cand_valid))
        kept_score = _follow_score(fresh, chosen[0], plan)
    else:
        chosen = selector.select(view, plan)
    for layer_idx, (layer, idx) in enumerate(zip(cache.layers, chosen, strict=True)):
        if trace or layer_idx == 0:
            doc_index[layer_idx] = _follow(doc_index[layer_idx], block_doc, idx, plan)
        layer.keys, layer.values = gather_layer(layer.keys, layer.values, lp, idx, cand_pos, plan, inv_freq)
    return plan, kept_score


def record_step(trace: list[FinchStep], i: int, slots: int, pass_valid: torch.Tensor,
                new_kept: torch.Tensor, doc_index: list[torch.Tensor], kept_score: torch.Tensor,
                early: bool) -> None:
    """Append chunk pass ``i`` to ``trace``: ``pass_valid`` [B, S] the real slots of every row
    during the pass (block included)."""
    trace.append(FinchStep(i, slots, pass_valid.sum(dim=1).tolist(), new_kept.tolist(),
                           list(doc_index), kept_score if early else None))
