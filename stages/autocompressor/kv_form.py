"""Summary form ``kv``: a segment is remembered as the keys/values of every k-th token.

Why a second form: the summary vectors of the paper (model.py) are fed back as input
embeddings, and on the embedded SmolLM2-135M they learned to carry almost nothing of their
own page (jobs/results/autocompressor/README.md). Summaries kept as every layer's keys and
values carry much more: in the CPU probe (pipeline/studies/kv_summary_probe.py, same held-out pages), the K/V of
every 10th page token, trained with a LoRA adapter for 600 steps, took the continuation's
NLL from 2.951 (no context) to 2.639 against 2.304 with the full page. The adapter learns
to pack each stretch of ``stride`` tokens into the position kept at its end.

Mechanism (``ACConfig.summary_form == "kv"``, ``ACConfig.kv_stride`` = k):
- The document is read in segments, in order. Segment s attends causally to its own
  tokens and to the kept slots of every earlier segment (and to the prompt prefix at
  inference), nothing else.
- After segment s, only the positions ``k-1, 2k-1, ...`` of the segment (counted from its
  first token) stay in the cache, keeping the RoPE positions they were read at (the
  document's own token positions, contiguous across segments). A segment shorter than
  k keeps nothing.
- What follows (the question, or the continuation when training) attends to the kept
  slots of all segments and to itself.
Training (``kv_forward``) expresses exactly this in one pass with a block mask; inference
(``kv_prefill``) builds it segment by segment in a KV cache, so memory stays bounded by
the kept slots plus one segment. The tests check the two give the same logits.

Contract of ``kv_prefill``: like ``prefill.autocompressor_prefill``, returns a
CompressedPrefill whose state any decoder continues with ``forward_step`` on ``ac.lm``;
the cache is ``[prefix ; kept document slots ; query]`` per row (the kept slots sit where
the document does, so ``soft_prompt_at`` does not apply), rows right-aligned into one
left-padded batch. ``context_tokens[b]`` = kept slots of row b. A row with an empty query
(LM scoring: what follows is the continuation) reads its document's last token as its
query instead (counted in context_tokens): otherwise the first continuation token would
be predicted by a token that read its whole segment, not the kept slots alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import DynamicCache

from stages.decoding.state import CompressedPrefill, PrefillState, forward_step
from stages.kv.model_parts import decoder
from stages.kv.slots import keep_slots, stack_rows
from stages.prompting import PromptParts


class AutoCompressor(Protocol):
    """What this module reads of model.AutoCompressor (declared here, not imported: model.py
    dispatches its kv-form training pass to ``kv_forward``, so importing it back would close
    an import circle; tests/stages/test_import_graph.py)."""

    lm: torch.nn.Module  # the causal LM (a transformers PreTrainedModel)
    config: object  # model.ACConfig; this module reads ``kv_stride``

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...  # [B, T] -> [B, T, H_in]

    def next_token_loss(self, hidden: torch.Tensor, ids: torch.Tensor, loss_from: int) -> tuple[torch.Tensor, int]: ...


def kept_offsets(length: int, stride: int) -> list[int]:
    """Offsets within a segment of ``length`` tokens whose K/V are kept: k-1, 2k-1, ..."""
    if stride < 1:
        raise ValueError(f"kv_stride must be >= 1, got {stride}")
    return list(range(stride - 1, length, stride))


def kv_block_mask(segment_lengths: Sequence[int], stride: int, device: torch.device) -> torch.Tensor:
    """[T, T] bool (True = attend) for one training pass over consecutive segments.

    Query t attends to key u <= t when u is in t's segment or u is a kept slot of an
    earlier segment (see the module docstring). T = sum(segment_lengths).
    """
    lengths = torch.tensor(list(segment_lengths), device=device)
    seg = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)  # [T]
    starts = torch.cumsum(lengths, 0) - lengths
    t = int(lengths.sum())
    offset = torch.arange(t, device=device) - starts[seg]
    kept = (offset % stride) == stride - 1  # [T]
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return causal & ((seg[:, None] == seg[None, :]) | kept[None, :])


def kv_forward(
    ac: AutoCompressor, ids: torch.Tensor, segment_lengths: Sequence[int], loss_from: int = 0
) -> tuple[torch.Tensor, int]:
    """Training pass of the kv form: (summed next-token loss, predicted tokens) over ids [B, T]
    read as segments.

    One decoder pass under ``kv_block_mask``, positions 0..T-1. The loss counts targets at
    index >= loss_from, as ``AutoCompressor.forward``, which wraps it in a SegmentLoss with an
    empty soft prompt (the kv form carries nothing between substeps; TrainConfig requires one
    substep).
    """
    b, t = ids.shape
    mask = kv_block_mask(segment_lengths, ac.config.kv_stride, ids.device)[None, None].expand(b, 1, t, t)
    pos = torch.arange(t, device=ids.device)[None].expand(b, t)
    out = decoder(ac.lm)(inputs_embeds=ac.embed(ids), attention_mask=mask, position_ids=pos, use_cache=False)
    return ac.next_token_loss(out.last_hidden_state, ids, loss_from)


def _feed(lm, cache: DynamicCache, ids: list[int], pos0: int) -> torch.Tensor:
    """Feed one row's ``ids`` at positions pos0.. on top of every cached slot. Returns the
    last logits [V] float32."""
    dev = lm.device
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    past = torch.ones((1, cache.get_seq_length()), dtype=torch.bool, device=dev)
    new = torch.ones((1, len(ids)), dtype=torch.bool, device=dev)
    pos = torch.arange(pos0, pos0 + len(ids), device=dev)[None]
    logits, _ = forward_step(lm, cache, past, x, pos, new, logits_to_keep=1)
    return logits[0, -1]


def compress_row(
    ac: AutoCompressor, prefix: list[int], segments: Sequence[Sequence[int]]
) -> tuple[DynamicCache, int, torch.Tensor | None]:
    """One row's cache ``[prefix ; kept slots of each segment]``.

    Returns (cache, next position, last logits [V] or None when nothing was fed).
    """
    lm, stride = ac.lm, ac.config.kv_stride
    cache = DynamicCache(config=lm.config)
    pos, logits = 0, None
    if prefix:
        logits = _feed(lm, cache, list(prefix), 0)
        pos = len(prefix)
    for seg in segments:
        if not seg:
            raise ValueError("compress: segments must be non-empty")
        before = cache.get_seq_length()
        logits = _feed(lm, cache, list(seg), pos)
        pos += len(seg)
        keep = list(range(before)) + [before + o for o in kept_offsets(len(seg), stride)]
        keep_slots(cache, torch.tensor(keep, dtype=torch.long, device=lm.device))
    return cache, pos, logits


@torch.inference_mode()
def kv_prefill(ac: AutoCompressor, parts: list[PromptParts], rows: list[list[list[int]]]) -> CompressedPrefill:
    """Compress each row's segments (``rows[b]``, from prefill.document_segments) into kept
    slots after its prefix, then feed its query; one left-padded state for the batch.

    Rows are compressed one at a time (batch 1): their segment counts differ, and the
    kept slots are what the batch shares. compress_s[b]: seconds row b's prefix and
    document took (its query's pass is prefill, not compression).
    """
    if not parts:
        raise ValueError("kv_prefill needs at least one row")
    t0 = time.perf_counter()
    caches, next_pos, last, kept, compress_s = [], [], [], [], []
    for p, segs in zip(parts, rows, strict=True):
        segs, query = [list(s) for s in segs], list(p.query_ids)
        if not query and segs:  # see the module docstring: the last token becomes the query
            query = [segs[-1].pop()]
            segs = [s for s in segs if s]
        tc = time.perf_counter()
        cache, pos, logits = compress_row(ac, list(p.prefix_ids), segs)
        compress_s.append(time.perf_counter() - tc)
        kept.append(cache.get_seq_length() - len(p.prefix_ids) + (0 if p.query_ids else len(query)))
        if query:
            logits = _feed(ac.lm, cache, query, pos)
            pos += len(query)
        if logits is None:
            raise ValueError("autocompressor prefill needs a non-empty prompt or document per row")
        caches.append(cache)
        next_pos.append(pos)
        last.append(logits)
    cache, valid = stack_rows(caches, ac.lm.config)
    dev = ac.lm.device
    state = PrefillState(
        cache=cache,
        valid=valid,
        next_pos=torch.tensor(next_pos, dtype=torch.long, device=dev),
        last_logits=torch.stack(last),
        prefill_s=time.perf_counter() - t0,
    )
    return CompressedPrefill(state=state, context_tokens=kept, compress_s=compress_s)
