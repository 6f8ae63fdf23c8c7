"""AutoCompressor prefill strategy: document -> summary vectors -> soft-prompted prefill.

Contract: ``autocompressor_prefill(ac, parts, config, pad_id)`` returns a CompressedPrefill
whose state (stages/decoding/state.py) any decoder continues with ``forward_step`` on
``ac.lm``. Per row:
1. document tokens = ``context_ids``, cut to the last ``config.target_tokens`` when set (the
   spec's "tail kept"; the tail is what the question most often follows in our corpora
   and keeps the soft prompt short), with the model's BOS first when the checkpoint
   compresses ``tokenizer(context)`` (published ones do);
2. split into segments of ``config.segment_tokens`` (the last may be shorter);
3. ``ac.compress`` -> the accumulated soft prompt [S_b, H_in];
4. one left-padded prefill over ``[soft ; prefix ; query]`` (``soft_prompt_at="start"``: the
   published convention, ``model(prompt_ids, softprompt=...)``, and the one our training
   teaches: a soft prompt followed by text) or ``[prefix ; soft ; query]``
   (``"document"``: where the document text would sit in the chat template).
Rows with fewer summaries simply carry more left padding; positions follow the
checkpoint's scheme (model.position_ids), so each row's numbering starts at 0 whatever its
padding. ``context_tokens[b]`` = S_b, the number of summary vectors row b conditions on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from stages.autocompressor.checkpoint import load_autocompressor
from stages.autocompressor.model import AutoCompressor, position_ids
from stages.decoding.state import CompressedPrefill, PrefillState, forward_step
from stages.prompting import PromptParts

if TYPE_CHECKING:
    from stages.autocompressor.config import AutoCompressorCompression

__all__ = ["autocompressor_prefill", "document_segments", "load_autocompressor", "prefill_soft"]


def document_segments(
    context_ids: list[int],
    segment_tokens: int,
    target_tokens: int | None = None,
    bos_id: int | None = None,
) -> list[list[int]]:
    """The segments one row's document is compressed in (see module docstring, steps 1-2)."""
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    doc = list(context_ids)
    if target_tokens is not None:
        doc = doc[len(doc) - target_tokens :] if len(doc) > target_tokens else doc
    if bos_id is not None and doc:
        doc = [bos_id] + doc
    return [doc[i : i + segment_tokens] for i in range(0, len(doc), segment_tokens)]


def prefill_soft(
    ac: AutoCompressor,
    parts: list[PromptParts],
    soft: list[torch.Tensor],
    soft_at: str,
    pad_id: int,
) -> PrefillState:
    """Prefill each row's prompt with its soft prompt spliced in (one left-padded batch).

    soft[b]: [S_b, H_in]. Returns a PrefillState over a cache of width
    max_b(S_b + len(prefix_b) + len(query_b)).
    """
    if soft_at not in ("start", "document"):
        raise ValueError(f"soft_prompt_at {soft_at!r} not supported; allowed: start, document")
    lm, dev = ac.lm, ac.device
    pieces = []  # per row: (tokens before soft, tokens after soft)
    for p in parts:
        text = list(p.prefix_ids) + list(p.query_ids)
        pieces.append(([], text) if soft_at == "start" else (list(p.prefix_ids), list(p.query_ids)))
    lengths = [len(a) + s.shape[0] + len(z) for (a, z), s in zip(pieces, soft, strict=True)]
    if min(lengths) == 0:
        raise ValueError("autocompressor prefill needs a non-empty prompt or document per row")
    b, width = len(parts), max(lengths)
    ids = torch.full((b, width), pad_id, dtype=torch.long, device=dev)
    real = torch.zeros((b, width), dtype=torch.bool, device=dev)
    is_soft = torch.zeros((b, width), dtype=torch.bool, device=dev)
    for r, ((before, after), s) in enumerate(zip(pieces, soft, strict=True)):
        o = width - lengths[r]  # left padding
        n_soft = s.shape[0]
        row = before + [pad_id] * n_soft + after
        ids[r, o:] = torch.tensor(row, dtype=torch.long, device=dev)
        real[r, o:] = True
        is_soft[r, o + len(before) : o + len(before) + n_soft] = True
    embeds = ac.embed(ids)  # [B, T, H_in]
    for r, s in enumerate(soft):
        if s.shape[0]:
            embeds[r, is_soft[r]] = s.to(embeds.dtype)
    is_text = real & ~is_soft
    pos = position_ids(real, is_text, ac.config.position_scheme)  # [B, T]
    counted = real if ac.config.position_scheme == "contiguous" else is_text
    cache = DynamicCache(config=lm.config)
    empty = torch.zeros((b, 0), dtype=torch.bool, device=dev)
    logits, valid = forward_step(
        lm, cache, empty, None, pos, real, inputs_embeds=embeds, logits_to_keep=1
    )
    return PrefillState(
        cache=cache, valid=valid, next_pos=counted.long().sum(dim=1), last_logits=logits[:, -1, :]
    )


@torch.inference_mode()
def autocompressor_prefill(
    ac_model: AutoCompressor,
    parts: list[PromptParts],
    config: AutoCompressorCompression,
    pad_id: int,
) -> CompressedPrefill:
    """Compress each row's document to summary vectors and prefill the soft-prompted prompt."""
    if not parts:
        raise ValueError("autocompressor_prefill needs at least one row")
    t0 = time.perf_counter()
    bos = ac_model.lm.config.bos_token_id if ac_model.config.bos_first_segment else None
    segment = config.segment_tokens_for(ac_model.config.summary_form)
    rows = [document_segments(p.context_ids, segment, config.target_tokens, bos) for p in parts]
    if ac_model.config.summary_form == "kv":  # kept keys/values instead of soft prompts
        from stages.autocompressor.kv_form import kv_prefill

        return kv_prefill(ac_model, parts, rows)
    soft = ac_model.compress(rows)
    compress_s = time.perf_counter() - t0
    state = prefill_soft(ac_model, parts, soft, config.soft_prompt_at, pad_id)
    state.prefill_s = time.perf_counter() - t0
    return CompressedPrefill(
        state=state,
        context_tokens=[int(s.shape[0]) for s in soft],
        compress_s=[compress_s / len(parts)] * len(parts),
    )
