"""The engine's model view and its attention (stages/decoding/forward.py).

packed_gqa_sdpa must compute exactly what plain SDPA computes with every KV head
repeated for its query heads (transformers' own GQA path), for explicit masks, for the
causal case without a mask (a first prefill chunk, and a later chunk over a cache), and
over a span narrower than the keys, and within a layer's sliding window (each query sees
the ``window`` slots up to its own); decode_view must share every weight with the
caller's model and leave that model as it was.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.decoding.forward import (
    attention_name,
    cache_kwargs,
    decode_view,
    packed_gqa_sdpa,
    windowed,
)


def _qkv(b: int, hq: int, hkv: int, t: int, s: int, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, t, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, d, generator=g))


def _plain(q, k, v, mask=None, causal=False, scale=None) -> torch.Tensor:
    """SDPA with KV heads repeated (head h reads KV head h // rep), as [B, T, Hq, D]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale).transpose(1, 2)


@pytest.mark.parametrize(("hq", "hkv"), [(6, 2), (4, 4), (8, 1)])
def test_packed_gqa_equals_repeated_kv_heads_with_a_mask(hq, hkv):
    q, k, v = _qkv(2, hq, hkv, t=5, s=11)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(2, 1, 5, 11, generator=g) < 0.6
    mask[..., 0] = True  # no query row fully masked
    out, none = packed_gqa_sdpa(None, q, k, v, mask, scaling=0.3)
    assert none is None and out.shape == (2, 5, hq, 8)
    torch.testing.assert_close(out, _plain(q, k, v, mask, scale=0.3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("t", "s"), [(7, 7), (4, 10), (1, 9)])
def test_packed_gqa_without_a_mask_is_causal_over_the_cache(t, s):
    """No mask (transformers passes none for an attention name it does not know): a first
    chunk (T == S) is plain causal attention; a later chunk's token i sees the S - T cached
    slots and the chunk up to itself; one token sees everything."""
    q, k, v = _qkv(1, 6, 2, t=t, s=s)
    causal = torch.ones(t, s, dtype=torch.bool).tril(s - t)[None, None]
    out, _ = packed_gqa_sdpa(None, q, k, v, None)
    torch.testing.assert_close(out, _plain(q, k, v, causal), rtol=1e-5, atol=1e-6)


def test_a_mask_narrower_than_the_keys_reads_only_its_span():
    q, k, v = _qkv(2, 4, 2, t=3, s=12)
    mask = torch.ones(2, 1, 3, 7, dtype=torch.bool)
    mask[1, :, :, :2] = False  # row 1: two invalid slots (left padding)
    out, _ = packed_gqa_sdpa(None, q, k, v, mask)
    torch.testing.assert_close(out, _plain(q, k[:, :, :7], v[:, :, :7], mask), rtol=1e-5, atol=1e-6)
    # Slots past the span never matter.
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 7:], v2[:, :, 7:] = 1e4, float("nan")
    torch.testing.assert_close(packed_gqa_sdpa(None, q, k2, v2, mask)[0], out)


def _window(t: int, s: int, w: int) -> torch.Tensor:
    """[1, 1, T, S]: query i at slot s - t + i sees slots j with slot - w < j <= slot."""
    q = torch.arange(s - t, s)[:, None]
    j = torch.arange(s)[None]
    return ((j <= q) & (j > q - w))[None, None]


@pytest.mark.parametrize(("t", "s"), [(7, 7), (4, 10), (1, 9)])
def test_a_sliding_window_without_a_mask_keeps_the_last_slots_of_each_query(t, s):
    q, k, v = _qkv(1, 6, 2, t=t, s=s)
    out, _ = packed_gqa_sdpa(None, q, k, v, None, sliding_window=3)
    torch.testing.assert_close(out, _plain(q, k, v, _window(t, s, 3)), rtol=1e-5, atol=1e-6)
    # A window as wide as the keys is full causal attention.
    wide, _ = packed_gqa_sdpa(None, q, k, v, None, sliding_window=s)
    torch.testing.assert_close(wide, packed_gqa_sdpa(None, q, k, v, None)[0])


def test_a_sliding_window_narrows_each_rows_own_mask():
    """Rows of other lengths (the engine's decode mask: slot j visible iff j <= the query's
    slot): each query keeps the ``window`` slots ending at its own, whatever its row's length."""
    at = torch.tensor([[4, 5], [8, 9]])  # [B, T] the slot each query writes
    mask = (torch.arange(10)[None, None] <= at[:, :, None])[:, None]  # [2, 1, 2, 10]
    got = windowed(mask, 3, 2, 10, mask.device)
    want = mask & (torch.arange(10)[None, None, None] > at[:, None, :, None] - 3)
    assert torch.equal(got, want) and got.sum(-1).tolist() == [[[3, 3]], [[3, 3]]]
    q, k, v = _qkv(2, 4, 1, t=2, s=10)
    out, _ = packed_gqa_sdpa(None, q, k, v, mask, sliding_window=3)
    torch.testing.assert_close(out, _plain(q, k, v, want), rtol=1e-5, atol=1e-6)


def test_decode_view_shares_every_weight_and_leaves_the_model_alone(tiny_llama_factory):
    model = tiny_llama_factory(300, seed=2)
    before = model.config._attn_implementation
    view = decode_view(model)
    assert view is not model and view.config is not model.config
    assert view.config._attn_implementation == attention_name(packed_gqa_sdpa)  # sdpa models attend packed
    assert model.config._attn_implementation == before == "sdpa"
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert {n: p.data_ptr() for n, p in view.named_parameters()} == ptrs  # no weight copied
    assert view.lm_head.weight is view.model.embed_tokens.weight  # tied weights stay tied
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.inference_mode():
        want = model(ids).logits
        torch.testing.assert_close(view(ids).logits, want, rtol=1e-5, atol=1e-5)
        model.model.norm.weight.mul_(2.0)  # an in-place update of the model shows in the view
        torch.testing.assert_close(view(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(view(ids).logits, want)


def test_the_attention_is_installed_on_the_view_alone(tiny_llama_factory):
    """A backend's attention reaches the view it made, never another model (no global switch)."""
    calls = []

    def counting(module, query, key, value, attention_mask, *args, **kwargs):
        calls.append(query.shape)
        return packed_gqa_sdpa(module, query, key, value, attention_mask, *args, **kwargs)

    model = tiny_llama_factory(300, seed=2)
    other = tiny_llama_factory(300, seed=3)
    view = decode_view(model, counting)
    ids = torch.tensor([[5, 17, 42, 7]])
    with torch.inference_mode():
        model(ids), other(ids), decode_view(other)(ids)
        assert not calls  # the caller's model, another model and another view: their own attention
        view(ids)
    assert len(calls) == model.config.num_hidden_layers


def test_decode_view_keeps_an_explicit_attention_choice(tiny_llama_factory):
    model = tiny_llama_factory(300, seed=2)
    model.config._attn_implementation = "eager"
    assert decode_view(model).config._attn_implementation == "eager"


def test_cache_kwargs_names_the_keyword_this_transformers_takes(tiny_llama_factory):
    import inspect

    model = tiny_llama_factory(300)
    (name,) = cache_kwargs(model, "C").keys()
    assert name in inspect.signature(type(model).forward).parameters
    assert cache_kwargs(model, "C")[name] == "C"
