"""The decode attention kernel (stages/decoding/backends/cpu_native/attention.py ``attend``,
attention.c ``ld_attend``): SDPA's results for decode and narrow verify steps, only the keys
a row sees, SDPA outside its contract, and the backend's view attending through it.

The portable path runs on every machine with a C compiler, the AVX-512 path where the CPU
has it (skipped elsewhere, by name)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from stages.decoding.backends.cpu_native import attention, portable_native_attention

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the kernel")


def _fast_path() -> bool:
    return shutil.which("cc") is not None and bool(attention.build_library().ld_fast_path())


PATHS = [
    pytest.param(True, id="portable"),
    pytest.param(False, id="avx512", marks=pytest.mark.skipif("not _fast_path()", reason="no AVX-512 on this CPU")),
]


def _step(b, g, rep, t, d, span, capacity, dtype, seed=0):
    """Packed queries [b, g, rep*t, d], slot tensors [b, g, capacity, d] and the engine's mask
    [b, t, span] (row i: a context of lengths[i] slots, then its t step tokens causally)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, g, rep * t, d, generator=gen).to(dtype)
    k = torch.randn(b, g, capacity, d, generator=gen).to(dtype)
    v = torch.randn(b, g, capacity, d, generator=gen).to(dtype)
    lengths = torch.randint(1, span - t + 1, (b,), generator=gen)
    mask = torch.arange(span)[None, None, :] <= (lengths[:, None, None] + torch.arange(t)[None, :, None])
    return q, k, v, mask


def _sdpa(q, k, v, mask, rep):
    """SDPA of packed rows: row r of a KV head is step token r % t (the mask repeated per head)."""
    span = mask.shape[-1]
    return F.scaled_dot_product_attention(
        q, k[:, :, :span], v[:, :, :span], attn_mask=mask[:, None].repeat(1, 1, rep, 1), scale=q.shape[-1] ** -0.5
    )


def _attend(q, k, v, mask, scale, portable):
    span = mask.shape[-1]
    return attention.attend(q, k[:, :, :span], v[:, :, :span], mask, scale, portable=portable)


SHAPES = [  # (rows, KV heads, query heads per KV head, step width, head size, span, capacity)
    (5, 3, 3, 1, 64, 257, 300),  # the embedded model's decode step
    (5, 3, 3, 5, 64, 300, 300),  # a verify step of 4 drafts over the whole capacity
    (2, 8, 4, 4, 128, 90, 100),  # Llama-8B's heads, a verify step of 3 drafts
    (3, 2, 1, 1, 48, 33, 40),  # no grouping; a head size the AVX-512 path does not take
]


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_decode_kernel_gives_sdpas_attention(kernel, shape, portable):
    """float32: within a few float32 ulps of SDPA; bfloat16 slots: within one bfloat16 rounding."""
    for dtype, tol in ((torch.float32, 3e-6), (torch.bfloat16, 8e-3)):
        q, k, v, mask = _step(*shape, dtype)
        out = _attend(q, k, v, mask, q.shape[-1] ** -0.5, portable)
        if shape[2] * shape[3] > attention.MAX_QUERY_ROWS[dtype]:  # too wide for this dtype: SDPA's
            assert out is None
            continue
        ref = _sdpa(q, k, v, mask, shape[2])
        assert out is not None and out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=0)


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
def test_keys_a_row_does_not_see_are_never_read(kernel, portable):
    """NaN in every slot a row's mask hides (past its context, and a hole inside it) stays out."""
    q, k, v, mask = _step(4, 3, 3, 2, 64, 200, 256, torch.float32, seed=1)
    mask[:, :, 5] = False  # a hole in every row's context
    hidden = ~mask.any(dim=1)  # [b, span] slots no query of the row sees
    for t in (k, v):
        t[:, :, 200:] = float("nan")
        t[:, :, :200].masked_fill_(hidden[:, None, :, None], float("nan"))
    out = _attend(q, k, v, mask, 0.125, portable)
    assert torch.isfinite(out).all()
    clean_k, clean_v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    ref = F.scaled_dot_product_attention(
        q, clean_k[:, :, :200], clean_v[:, :, :200], attn_mask=mask[:, None].repeat(1, 1, 3, 1), scale=0.125
    )
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=0)


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
def test_a_query_that_sees_no_key_gets_zeros(kernel, portable):
    q, k, v, mask = _step(2, 1, 2, 1, 64, 64, 64, torch.float32)
    mask[1] = False
    out = _attend(q, k, v, mask, 0.125, portable)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[:1], _sdpa(q, k, v, mask, 2)[:1], atol=3e-6, rtol=0)


@needs_compiler
def test_steps_outside_the_contract_go_to_sdpa(kernel):
    q, k, v, mask = _step(2, 3, 3, 1, 64, 50, 64, torch.float32)
    k16, v16 = k.half(), v.half()
    assert _attend(q, k16, v16, mask, 0.125, True) is None  # float16 slots
    assert _attend(q, k, v, mask.float(), 0.125, True) is None  # an additive mask
    for dtype, rows in attention.MAX_QUERY_ROWS.items():
        kd, vd, qd = k.to(dtype), v.to(dtype), q.to(dtype)
        width = rows // 3 + 1  # 3 query heads per KV head: a step too wide for this dtype
        wide = torch.ones(2, width, 50, dtype=torch.bool)
        assert _attend(qd.repeat(1, 1, width, 1), kd, vd, wide, 0.125, True) is None
        narrow = wide[:, : width - 1]
        assert _attend(qd.repeat(1, 1, width - 1, 1), kd, vd, narrow, 0.125, True) is not None


@needs_compiler
def test_the_backends_view_attends_through_the_decode_kernel(kernel):
    """The attention function the CPU-native backend installs, on a decode step with the
    engine's mask [B, 1, T, L] over the first L of the slots: the kernel's result, equal to SDPA's."""
    q, k, v, mask = _step(3, 3, 3, 2, 64, 100, 128, torch.float32)
    query = q.reshape(3, 3, 3, 2, 64).reshape(3, 9, 2, 64)  # [B, Hq, T, D]: head h = g * rep + r // T
    out, _ = portable_native_attention(torch.nn.Module(), query, k, v, mask[:, None], scaling=0.125)
    ref = _sdpa(q, k, v, mask, 3).reshape(3, 9, 2, 64).transpose(1, 2)
    assert out.shape == (3, 2, 9, 64)
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=0)
    mine = _attend(q, k, v, mask, 0.125, True)
    assert torch.equal(out, mine.reshape(3, 9, 2, 64).transpose(1, 2).contiguous())  # the kernel ran
