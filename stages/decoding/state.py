"""The hand-off between a prefill strategy and the decoder: ``PrefillState``.

Contract (every prefill strategy — full, Finch, AutoCompressor — returns this, and
the decoders accept nothing else):
- ``cache``: a transformers ``DynamicCache``; every layer holds keys/values of shape
  ``[B, H_kv, S, D]``. Slot ``s`` of row ``b`` is real iff ``valid[b, s]``; invalid
  slots (left padding, holes left by rejected drafts) are never attended to.
- ``valid``: ``[B, S]`` bool.
- ``next_pos``: ``[B]`` long, the RoPE position of the next token fed for each row.
  Positions need not equal slot indices (left padding, Finch's re-rotated cache).
- ``last_logits``: ``[B, V]`` float32, the logits that predict each row's first new token.
- ``prefill_s``: wall seconds of the prefill (for the whole batch).

Masks: we always hand the model an explicit 4D boolean mask built here, so
causality is defined by cache slot order and padding/holes by ``valid``, whatever
heuristics the installed transformers version applies to 2D masks. A model that attends
within a sliding window in some layers (Gemma 3, Mistral, ...) takes that mask as given,
so its windowed layers get one narrowed here (``model_masks``), by the distance between
real tokens: what the model computes for the row alone, whatever its padding or holes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from stages.decoding.forward import cache_kwargs
from stages.kv.model_parts import sliding_window, text_config
from stages.kv.slots import stack_caches


@dataclass
class PrefillState:
    cache: DynamicCache
    valid: torch.Tensor  # [B, S] bool
    next_pos: torch.Tensor  # [B] long
    last_logits: torch.Tensor  # [B, V] float32
    prefill_s: float = 0.0

    @property
    def batch_size(self) -> int:
        return int(self.valid.shape[0])


def step_mask(valid_past: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
    """4D boolean attention mask for feeding ``T`` new tokens on top of a cache.

    valid_past: [B, S] bool, which cached slots are real.
    new_valid:  [B, T] bool, which of the new tokens are real (False = padding).
    Returns [B, 1, T, S + T] bool (True = attend): new token t sees every valid past
    slot and the valid new tokens at or before t. A padding token sees only itself,
    so no query row is fully masked (that would produce NaN states under SDPA, and
    NaN values poison later rows even when masked, since 0 * NaN = NaN).
    """
    b, t = new_valid.shape
    dev = valid_past.device
    causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()  # [T, T]
    new_part = causal[None] & new_valid[:, None, :]  # [B, T, T]
    eye = torch.eye(t, dtype=torch.bool, device=dev)[None]
    new_part = new_part | (eye & ~new_valid[:, :, None])
    past_part = valid_past[:, None, :].expand(b, t, valid_past.shape[1]) & new_valid[:, :, None]
    return torch.cat([past_part, new_part], dim=-1)[:, None]  # [B, 1, T, S+T]


def model_masks(model, mask: torch.Tensor, valid_past: torch.Tensor, new_valid: torch.Tensor):
    """``mask`` ([B, 1, T, S + T] bool, ``step_mask``) as ``model`` takes it: unchanged for a
    model without sliding windows; for one with them, the same mask with each query kept to
    the keys less than the window away in real tokens, as the mask of every layer (no layer
    types: Mistral) or as ``{"full_attention": mask, "sliding_attention": narrowed}``
    (transformers' per-layer-type masks: Gemma 2/3, Qwen2)."""
    cfg = text_config(model.config)
    window = sliding_window(cfg)
    if window is None:
        return mask
    t = new_valid.shape[1]
    pos = torch.cat([valid_past, new_valid], dim=1).long().cumsum(dim=1)  # [B, S+T] real tokens so far
    near = (pos[:, -t:, None] - pos[:, None, :]) < window  # [B, T, S+T]
    narrowed = mask & near[:, None]
    if getattr(cfg, "layer_types", None) is None:
        return narrowed
    return {"full_attention": mask, "sliding_attention": narrowed}


def forward_step(
    model,
    cache: DynamicCache,
    valid: torch.Tensor,
    input_ids: torch.Tensor | None,
    positions: torch.Tensor,
    new_valid: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
    logits_to_keep: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed ``T`` tokens per row on top of ``cache`` (appends T slots to every layer).

    input_ids: [B, T] long (or inputs_embeds: [B, T, H]); positions: [B, T] long RoPE
    positions; new_valid: [B, T] bool. Returns (logits [B, T, V] float32, updated
    valid [B, S + T]).
    """
    mask = model_masks(model, step_mask(valid, new_valid), valid, new_valid)
    out = model(
        input_ids=input_ids,
        inputs_embeds=inputs_embeds,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **cache_kwargs(model, cache),
    )
    return out.logits.float(), torch.cat([valid, new_valid], dim=1)


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists. Returns (ids [B, L] long, real [B, L] bool)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    real = torch.zeros((len(seqs), width), dtype=torch.bool, device=device)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long, device=device)
            real[i, width - len(s) :] = True
    return ids, real


def positions_from_real(real: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE positions for a left-padded block: 0.. over real tokens (pads get 0).

    real: [B, L] bool; start: optional [B] long offset. Returns [B, L] long.
    """
    pos = (real.long().cumsum(dim=1) - 1).clamp(min=0)
    if start is not None:
        pos = pos + start[:, None]
    return pos


@torch.inference_mode()
def prefill_full(model, prompts: list[list[int]], pad_id: int) -> PrefillState:
    """Prefill whole prompts as one left-padded batch (the ``none``/text strategies).

    prompts: B token lists (each non-empty). Cache ends with S = max prompt length.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prefill_full needs non-empty prompts")
    t0 = time.perf_counter()
    device = model.device
    ids, real = left_pad(prompts, pad_id, device)
    # Full layers whatever the config: a config-made cache would drop a windowed layer's older
    # keys, while the contract keeps every slot and the masks apply windows (model_masks).
    cache = DynamicCache()
    empty = torch.zeros((len(prompts), 0), dtype=torch.bool, device=device)
    logits, valid = forward_step(
        model, cache, empty, ids, positions_from_real(real), real, logits_to_keep=1
    )
    next_pos = real.long().sum(dim=1)
    return PrefillState(
        cache=cache,
        valid=valid,
        next_pos=next_pos,
        last_logits=logits[:, -1, :],
        prefill_s=time.perf_counter() - t0,
    )


@dataclass
class CompressedPrefill:
    """What a compressing prefill strategy (Finch, AutoCompressor) returns.

    state: ready to decode. context_tokens: per row, the number of document-derived
    cache entries (or summary vectors) the model conditions on (the row's
    ``context_tokens`` column). compress_s: per row, seconds spent compressing (the
    batch's compression time split evenly across its rows). kept_positions: optional,
    per row, the ascending document token positions (indices into the row's
    ``PromptParts.context_ids``) whose keys/values, or re-prefilled tokens, the answer
    reads: the output's ``kept_spans`` and the eval's evidence recall
    (pipeline/eval/recall.py). None: the method keeps no document positions (summary
    vectors) or does not report them. prefilled_positions: optional, per row, the
    document positions (indices into ``PromptParts.context_ids``) the method prefilled
    as text, in the order it prefilled them (select lays sentences out by relevance):
    the output's ``context`` (output.keep_context). None: the model reads keys/values
    or summary vectors, not text (Finch's kept cache, AutoCompressor).
    """

    state: PrefillState
    context_tokens: list[int]
    compress_s: list[float]
    kept_positions: list[list[int]] | None = None
    prefilled_positions: list[list[int]] | None = None


# A group's rows are prefilled in length buckets: a row whose bucket is wider than its
# prompt computes the padding too, and a method's kept text varies widely between the
# questions of one document (a relevance floor keeps one sentence for one question and
# the whole budget for the next), so one padded batch can cost twice the real tokens.
# 1.25: a bucket holds at most 25% padding; batching rows of similar length keeps
# most of a batch's gain on a GPU, and a CPU gains little from batching at all.
MAX_BUCKET_PADDING = 1.25


def length_buckets(lengths: list[int], max_padding: float = MAX_BUCKET_PADDING) -> list[list[int]]:
    """Row indices in buckets of similar length, longest first: a bucket's rows padded to
    its longest cost at most ``max_padding`` x their real tokens (a row longer than that
    allows starts a new bucket). Every index appears once."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    buckets: list[list[int]] = []
    real = 0
    for r in order:
        if buckets and (len(buckets[-1]) + 1) * lengths[buckets[-1][0]] <= max_padding * (real + lengths[r]):
            buckets[-1].append(r)
            real += lengths[r]
        else:
            buckets.append([r])
            real = lengths[r]
    return buckets


def concat_states(model, states: list[PrefillState], order: list[int]) -> PrefillState:
    """One state of the rows of ``states`` (in bucket order), put back in input order:
    ``order[k]`` is the input row of the k-th row of the concatenation. Shorter caches
    are left-padded with invalid slots (zeros, never attended), as ``left_pad`` does."""
    cache, valid = stack_caches([(s.cache, s.valid) for s in states])
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))
    back = back.to(valid.device)
    cache.batch_select_indices(back)
    return PrefillState(
        cache=cache,
        valid=valid.index_select(0, back),
        next_pos=torch.cat([s.next_pos for s in states]).index_select(0, back),
        last_logits=torch.cat([s.last_logits for s in states]).index_select(0, back),
        prefill_s=sum(s.prefill_s for s in states),
    )


def prefill_buckets(model, prompts: list[list[int]], pad_id: int,
                    max_padding: float = MAX_BUCKET_PADDING) -> PrefillState:
    """``prefill_full`` of ``prompts`` in length buckets (``length_buckets``), joined into
    one state in input order: each row's cache, position and logits are its own prefill's,
    whatever rows share its call. Cache ends with S = max prompt length."""
    buckets = length_buckets([len(p) for p in prompts], max_padding)
    if len(buckets) == 1:
        return prefill_full(model, prompts, pad_id)
    states = [prefill_full(model, [prompts[r] for r in b], pad_id) for b in buckets]
    return concat_states(model, states, [r for b in buckets for r in b])
