"""The in-place KV buffer and the engine's forward pass agree with transformers' own path."""

from __future__ import annotations

import copy

import torch

from stages.decoding.forward import decode_view, forward_pick
from stages.decoding.kvbuffer import BufferLayer, adopt, compact, keep_rows
from stages.decoding.state import forward_step, prefill_full


def _state(model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (9, 4, 13)]
    return prefill_full(model, prompts, 0)


def _feed(state, t: int):
    b = state.batch_size
    ids = torch.randint(3, 2000, (b, t), generator=torch.Generator().manual_seed(t))
    new_valid = torch.ones(b, t, dtype=torch.bool)
    new_valid[1, t - 1 :] = False  # a ragged row
    pos = state.next_pos[:, None] + torch.arange(t)[None]
    return ids, pos, new_valid


@torch.inference_mode()
def test_forward_pick_matches_forward_step(tiny_model):
    ref_state = _state(tiny_model)
    state = copy.deepcopy(ref_state)
    adopt(state.cache, reserve=0)  # forces the buffer to grow below
    view = decode_view(tiny_model)  # attends through packed_gqa_sdpa
    assert view.config._attn_implementation == "longdoc_packed_gqa"
    for t in (3, 1, 20):
        ids, pos, nv = _feed(ref_state, t)
        want, ref_valid = forward_step(tiny_model, ref_state.cache, ref_state.valid, ids, pos, nv)
        pick = nv.flatten().nonzero().squeeze(1)
        got, valid = forward_pick(view, state.cache, state.valid, ids, pos, nv, pick)
        torch.testing.assert_close(got, want.flatten(0, 1)[pick], rtol=1e-4, atol=1e-4)
        assert torch.equal(valid, ref_valid)
        ref_state.valid, state.valid = ref_valid, valid
        ref_state.next_pos = state.next_pos = ref_state.next_pos + t
    assert isinstance(state.cache.layers[0], BufferLayer)
    assert state.cache.get_seq_length() == ref_state.cache.get_seq_length()
    assert tiny_model.config._attn_implementation == "sdpa"  # the caller's model is untouched


@torch.inference_mode()
def test_compact_and_keep_rows_preserve_attention(tiny_model):
    state = _state(tiny_model)
    adopt(state.cache, reserve=8)
    state.valid[0, 2:5] = False  # holes mid-row
    ids, pos, nv = _feed(state, 2)
    ref_cache = copy.deepcopy(state.cache)
    want, _ = forward_step(tiny_model, ref_cache, state.valid, ids, pos, nv)

    valid = compact(state.cache, state.valid)
    assert valid.shape[1] == int(state.valid.sum(1).max())
    assert torch.equal(valid.sum(1), state.valid.sum(1))
    got, _ = forward_step(tiny_model, copy.deepcopy(state.cache), valid, ids, pos, nv)
    torch.testing.assert_close(got[nv], want[nv], rtol=1e-4, atol=1e-4)

    rows = torch.tensor([2, 0])
    keep_rows(state.cache, rows)
    got2, _ = forward_step(tiny_model, state.cache, valid[rows], ids[rows], pos[rows], nv[rows])
    torch.testing.assert_close(got2[nv[rows]], want[rows][nv[rows]], rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_decode_view_is_the_same_model(tiny_model):
    """A plain call of the view (no mask: causal) gives the model's logits; weights are shared."""
    view = decode_view(tiny_model)
    ids = torch.randint(3, 2000, (2, 7), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(view(ids).logits, tiny_model(ids).logits, rtol=1e-5, atol=1e-5)
    assert view.config is not tiny_model.config
    assert all(a is b for a, b in zip(view.parameters(), tiny_model.parameters(), strict=True))
