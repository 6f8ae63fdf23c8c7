"""One Finch pass checked against an eager-attention reference.

With a single chunk covering the whole document, Finch's kept entries must be the
top-k of the paper's score computed from the reference model's explicit attention
weights (``output_attentions`` on an eager copy), in document order, with values
copied and keys moved to contiguous positions.
"""

from __future__ import annotations

import copy

import pytest
import torch
from finch_testlib import KV_VARIANTS, VARIANTS, random_parts, tiny

from stages.compression.finch import FinchCompression
from stages.finch.prefill import finch_prefill
from stages.kv.model_parts import rotary_module
from stages.kv.rope import rerotate


def reference_scores(model, parts, head_mode: str) -> tuple[list[torch.Tensor], list]:
    """Per layer [G, N] scores of the document tokens, from eager attention weights."""
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    ids = torch.tensor([parts.full_ids])
    out = eager(input_ids=ids, output_attentions=True, use_cache=True)
    lp, n, p = len(parts.prefix_ids), len(parts.context_ids), len(parts.query_ids)
    total = lp + n + p
    scores = []
    for att in out.attentions:  # [1, H, S, S]
        rows = att[0, :, total - p :, :]  # [H, P, S]
        counts = torch.arange(total - p + 1, total + 1, dtype=rows.dtype)  # slots row j sees
        s = (rows * counts[None, :, None]).sum(dim=1)[:, lp : lp + n]  # [H, N]
        h_kv = model.config.num_key_value_heads
        s = s.view(h_kv, -1, n).sum(dim=1)  # [Hkv, N]
        scores.append(s.sum(dim=0, keepdim=True) if head_mode == "sum" else s)
    return scores, out.past_key_values


@pytest.mark.parametrize("head_mode", ["sum", "kv_group"])
def test_single_pass_keeps_reference_topk(head_mode: str) -> None:
    model = tiny("llama", seed=3)
    parts = random_parts([(5, 40, 7)], seed=4)[0]
    k = 12
    cfg = FinchCompression(target_tokens=k, chunk_tokens=64, head_mode=head_mode, scoring="paper", mode="kv")
    out = finch_prefill(model, [parts], cfg, pad_id=0)
    ref_scores, ref_cache = reference_scores(model, parts, head_mode)
    lp = len(parts.prefix_ids)
    inv_freq = rotary_module(model).inv_freq
    h_kv = model.config.num_key_value_heads
    for layer, scores in enumerate(ref_scores):
        keep = scores.topk(k, dim=-1).indices.sort(dim=-1).values  # [G, k]
        keep = keep.expand(h_kv, k)
        got_k = out.state.cache.layers[layer].keys[0, :, lp : lp + k]  # [Hkv, k, D]
        got_v = out.state.cache.layers[layer].values[0, :, lp : lp + k]
        ref_k = ref_cache.layers[layer].keys[0, :, lp:]  # document + query slots
        ref_v = ref_cache.layers[layer].values[0, :, lp:]
        d = ref_k.shape[-1]
        want_v = ref_v.gather(1, keep[..., None].expand(h_kv, k, d))
        want_k = ref_k.gather(1, keep[..., None].expand(h_kv, k, d))
        delta = torch.arange(k)[None] - keep  # kept entry r moves to lp + r from lp + idx
        want_k = rerotate(want_k[None], delta[None], inv_freq)[0]
        # The eager reference runs its softmax in float32: float32-level agreement.
        torch.testing.assert_close(got_v, want_v, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got_k, want_k, atol=1e-6, rtol=1e-5)
    if head_mode == "kv_group":  # the two KV heads really choose differently here
        s = ref_scores[0].topk(k, dim=-1).indices.sort(dim=-1).values
        assert not torch.equal(s[0], s[1])


@pytest.mark.parametrize("variant", KV_VARIANTS)
def test_multi_pass_layer0_entries_match_tokens_at_new_positions(variant: str) -> None:
    """Layer 0 keys/values depend only on the token and its position, so after many
    passes each kept entry must equal its document token's projection rotated to
    its new contiguous position (checks gather, order and re-rotation end to end)."""
    model = tiny("llama", seed=7)
    parts = random_parts([(6, 150, 8), (3, 90, 5)], seed=8)
    cfg = FinchCompression(target_tokens=20, chunk_tokens=16, **VARIANTS[variant])
    trace = []
    out = finch_prefill(model, parts, cfg, 0, trace=trace)
    layer = out.state.cache.layers[0]
    lp = max(len(p.prefix_ids) for p in parts)
    for row, p in enumerate(parts):
        _check_row_layer0(model, layer, lp, row, p, trace[-1].kept_index[0][row], cfg.target_tokens)


@torch.inference_mode()
def _check_row_layer0(model, layer, lp: int, row: int, p, doc_idx: torch.Tensor, k: int) -> None:
    """doc_idx: [Hkv, k], the document index held by each kept slot of layer 0."""
    attn = model.model.layers[0].self_attn
    norm = model.model.layers[0].input_layernorm
    n, d = len(p.context_ids), attn.head_dim
    assert (doc_idx >= 0).all()
    h = norm(model.model.embed_tokens(torch.tensor(p.context_ids)))  # [N, hidden]
    k_all = attn.k_proj(h).view(n, -1, d).transpose(0, 1)  # [Hkv, N, D]
    v_all = attn.v_proj(h).view(n, -1, d).transpose(0, 1)
    pos = len(p.prefix_ids) + torch.arange(k)  # contiguous right after the prefix
    cos, sin = model.model.rotary_emb(k_all, pos[None])
    want_k = k_all.gather(1, doc_idx[..., None].expand(-1, -1, d))
    want_v = v_all.gather(1, doc_idx[..., None].expand(-1, -1, d))
    half = d // 2
    want_k = want_k * cos + torch.cat((-want_k[..., half:], want_k[..., :half]), -1) * sin
    torch.testing.assert_close(layer.values[row, :, lp : lp + k], want_v)
    torch.testing.assert_close(layer.keys[row, :, lp : lp + k], want_k, atol=1e-6, rtol=1e-6)
