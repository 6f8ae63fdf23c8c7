"""The CPU attention kernels (stages/decoding/cpu_attention.py, .c): SDPA's results for decode steps and
causal prefill chunks, only the keys a row sees, and SDPA whenever a kernel is not in use."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from stages.decoding import cpu_attention
from stages.decoding.forward import packed_gqa_sdpa

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the kernel")


def _step(b, g, rep, t, d, span, capacity, dtype, seed=0):
    """Packed queries [b, g, rep*t, d], slot tensors [b, g, capacity, d] and the engine's mask
    [b, t, span] (row i: context of lengths[i] slots, then its t step tokens causally)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, g, rep * t, d, generator=gen).to(dtype)
    k = torch.randn(b, g, capacity, d, generator=gen).to(dtype)
    v = torch.randn(b, g, capacity, d, generator=gen).to(dtype)
    lengths = torch.randint(1, span - t + 1, (b,), generator=gen)
    mask = torch.arange(span)[None, None, :] <= (lengths[:, None, None] + torch.arange(t)[None, :, None])
    return q, k, v, mask


def _sdpa(q, k, v, mask, rep):
    span = mask.shape[-1]
    return F.scaled_dot_product_attention(
        q, k[:, :, :span], v[:, :, :span], attn_mask=mask[:, None].repeat(1, 1, rep, 1), scale=q.shape[-1] ** -0.5
    )


SHAPES = [  # (rows, KV heads, query heads per KV head, step width, head size, span, capacity)
    (5, 3, 3, 1, 64, 257, 300),  # the embedded model's decode step
    (5, 3, 3, 5, 64, 300, 300),  # a verify step of 4 drafts over the whole capacity
    (2, 8, 4, 17, 128, 90, 100),  # Llama-8B's heads, the widest verify step
    (3, 2, 1, 1, 48, 33, 40),  # no grouping; a head size the AVX-512 path does not take
]


@needs_compiler
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("portable", [False, True])
def test_the_kernel_gives_sdpas_attention(fresh_kernel, shape, portable):
    """float32: within a few float32 ulps of SDPA; bfloat16: within one bfloat16 rounding."""
    lib = cpu_attention.build_library()
    for dtype, tol in ((torch.float32, 3e-6), (torch.bfloat16, 8e-3)):
        q, k, v, mask = _step(*shape, dtype)
        span = mask.shape[-1]
        out = cpu_attention.run_kernel(q, k[:, :, :span], v[:, :, :span], mask, q.shape[-1] ** -0.5, lib, portable)
        ref = _sdpa(q, k, v, mask, shape[2])
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=0)


@needs_compiler
@pytest.mark.parametrize("portable", [False, True])
def test_keys_a_row_does_not_see_are_never_read(fresh_kernel, portable):
    """NaN in every slot a row's mask hides (past its context, holes inside it) stays out."""
    lib = cpu_attention.build_library()
    q, k, v, mask = _step(4, 3, 3, 2, 64, 200, 256, torch.float32, seed=1)
    mask[:, :, 5] = False  # a hole in every row's context
    hidden = ~mask.any(dim=1)  # [b, span] slots no query of the row sees
    for t in (k, v):
        t[:, :, 200:] = float("nan")
        t[:, :, :200].masked_fill_(hidden[:, None, :, None], float("nan"))
    out = cpu_attention.run_kernel(q, k[:, :, :200], v[:, :, :200], mask, 0.125, lib, portable)
    assert torch.isfinite(out).all()
    clean_k, clean_v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    ref = F.scaled_dot_product_attention(
        q, clean_k[:, :, :200], clean_v[:, :, :200], attn_mask=mask[:, None].repeat(1, 1, 3, 1), scale=0.125
    )
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=0)


@needs_compiler
def test_a_query_that_sees_no_key_gets_zeros(fresh_kernel):
    lib = cpu_attention.build_library()
    q, k, v, mask = _step(2, 1, 2, 1, 64, 64, 64, torch.float32)
    mask[1] = False
    out = cpu_attention.run_kernel(q, k, v, mask, 0.125, lib)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[:1], _sdpa(q, k, v, mask, 2)[:1], atol=3e-6, rtol=0)


@needs_compiler
def test_the_model_view_attends_through_the_kernel_where_it_is_built(fresh_kernel):
    """forward.packed_gqa_sdpa on a CPU decode step: the kernel's result when in use, SDPA's otherwise."""
    q, k, v, mask = _step(3, 3, 3, 1, 64, 100, 128, torch.float32)
    query = q.reshape(3, 9, 1, 64)  # [B, Hq, T, D]: head h = g * rep + r
    out, _ = packed_gqa_sdpa(torch.nn.Module(), query, k, v, mask[:, None], scaling=0.125)
    ref = _sdpa(q, k, v, mask, 3).reshape(3, 9, 1, 64).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=3e-6, rtol=0)
    if cpu_attention.library() is not None:  # the kernel ran: not SDPA's bits
        lib = cpu_attention.library()
        mine = cpu_attention.run_kernel(q, k[:, :, :100], v[:, :, :100], mask, 0.125, lib)
        assert torch.equal(out, mine.reshape(3, 9, 1, 64).transpose(1, 2))


def test_sdpa_runs_when_asked_or_when_nothing_can_build_the_kernel(fresh_kernel, monkeypatch):
    q, k, v, mask = _step(2, 3, 3, 1, 64, 50, 64, torch.float32)
    monkeypatch.setenv("LONGDOC_CPU_ATTENTION", "sdpa")
    assert cpu_attention.status() == "SDPA (LONGDOC_CPU_ATTENTION=sdpa)"
    assert cpu_attention.attend(q, k[:, :, :50], v[:, :, :50], mask, 0.125) is None
    monkeypatch.delenv("LONGDOC_CPU_ATTENTION")
    cpu_attention._kernel_choice.cache_clear()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert cpu_attention.status().startswith("SDPA (no C compiler")
    assert not any(fresh_kernel.rglob("*.so"))


@needs_compiler
def test_a_failed_build_falls_back_to_sdpa_and_says_why(fresh_kernel, monkeypatch, tmp_path, caplog):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: this compiler always fails' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level("WARNING", logger=cpu_attention.__name__):
        assert "did not build or load" in cpu_attention.status()
    assert "always fails" in cpu_attention.status()
    assert any(r.levelname == "WARNING" and "always fails" in r.getMessage() for r in caplog.records)


@needs_compiler
def test_the_kernel_is_built_once_per_machine_and_reused(fresh_kernel, monkeypatch):
    cpu_attention.library()
    built = sorted(fresh_kernel.rglob("cpu_attention-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_attention._kernel_choice.cache_clear()  # a new process
    cpu_attention.library()
    assert sorted(fresh_kernel.rglob("cpu_attention-*.so")) == built and built[0].stat().st_mtime_ns == stamp
    assert not any(fresh_kernel.rglob("*.tmp"))


@needs_compiler
def test_inputs_outside_the_contract_go_to_sdpa(fresh_kernel):
    q, k, v, mask = _step(2, 3, 3, 1, 64, 50, 64, torch.float32)
    k16, v16 = k.half(), v.half()
    assert cpu_attention.attend(q, k16[:, :, :50], v16[:, :, :50], mask, 0.125) is None  # float16 slots
    assert cpu_attention.attend(q, k[:, :, :50], v[:, :, :50], mask.float(), 0.125) is None  # additive mask
    in_use = cpu_attention.library() is not None
    for dtype, rows in cpu_attention.MAX_QUERY_ROWS.items():
        kd, vd, qd = k.to(dtype), v.to(dtype), q.to(dtype)
        width = rows // 3 + 1  # 3 query heads per KV head: a step too wide for this dtype
        wide = torch.ones(2, width, 50, dtype=torch.bool)
        assert cpu_attention.attend(qd.repeat(1, 1, width, 1), kd[:, :, :50], vd[:, :, :50], wide, 0.125) is None
        narrow = wide[:, : width - 1]
        ran = cpu_attention.attend(qd.repeat(1, 1, width - 1, 1), kd[:, :, :50], vd[:, :, :50], narrow, 0.125)
        assert (ran is not None) == in_use


def _chunk(hq, hkv, d, t, cached, capacity, seed=0):
    """A prefill chunk as the model makes it: queries [1, Hq, T, D] as a transposed view of
    [1, T, Hq, D], keys/values [1, Hkv, S = cached + T, D] as the slot cache's first S slots."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, t, hq, d, generator=gen).transpose(1, 2)
    k = torch.randn(1, hkv, capacity, d, generator=gen)[:, :, : cached + t]
    v = torch.randn(1, hkv, capacity, d, generator=gen)[:, :, : cached + t]
    return q, k, v


def _causal_sdpa(q, k, v):
    """SDPA of a chunk whose T queries sit at the last T of S positions -> [1, T, Hq, D]."""
    t, s = q.shape[2], k.shape[2]
    mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=q.shape[-1] ** -0.5, enable_gqa=True)
    return out.transpose(1, 2)


CHUNKS = [  # (query heads, KV heads, head size, chunk tokens, tokens cached before it, capacity)
    (9, 3, 64, 300, 0, 320),  # the embedded model's first chunk
    (9, 3, 64, 37, 50, 100),  # a later chunk: keys before it, SDPA needs a mask there
    (32, 8, 128, 40, 9, 64),  # Llama-8B's heads
    (4, 4, 32, 17, 0, 20),  # no grouping
    (6, 2, 16, 1, 5, 8),  # one token; the tiny test models' head size
]


@needs_compiler
@pytest.mark.parametrize("shape", CHUNKS, ids=lambda s: "x".join(map(str, s)))
def test_the_causal_kernel_gives_sdpas_results(fresh_kernel, shape):
    if cpu_attention.library() is None:
        pytest.skip(cpu_attention.status())
    q, k, v = _chunk(*shape)
    out = cpu_attention.attend_causal(q, k, v, q.shape[-1] ** -0.5)
    assert out is not None and out.shape == (1, shape[3], shape[0], shape[2]) and out.is_contiguous()
    torch.testing.assert_close(out, _causal_sdpa(q, k, v), atol=3e-6, rtol=0)


@needs_compiler
def test_a_query_never_sees_a_later_key(fresh_kernel):
    """NaN in every key and value past the chunk's last token, and in the second half of the
    chunk's own keys/values: the first half of the queries must stay finite."""
    if cpu_attention.library() is None:
        pytest.skip(cpu_attention.status())
    q, clean_k, clean_v = _chunk(9, 3, 64, 40, 10, 64)
    k, v = clean_k.clone(), clean_v.clone()
    k[:, :, 30:], v[:, :, 30:] = float("nan"), float("nan")
    out = cpu_attention.attend_causal(q, k, v, 0.125)
    assert torch.isfinite(out[:, :20]).all() and torch.isnan(out[:, 20:]).all()
    torch.testing.assert_close(out[:, :20], _causal_sdpa(q, clean_k, clean_v)[:, :20], atol=3e-6, rtol=0)


def test_prefill_chunks_attend_through_the_causal_kernel_where_it_is_built(fresh_kernel):
    """forward.packed_gqa_sdpa without a mask (a prefill chunk): the kernel's result when in use."""
    q, k, v = _chunk(9, 3, 64, 37, 50, 100)
    out, _ = packed_gqa_sdpa(torch.nn.Module(), q, k, v, None, scaling=0.125)
    torch.testing.assert_close(out, _causal_sdpa(q, k, v), atol=3e-6, rtol=0)
    mine = cpu_attention.attend_causal(q, k, v, 0.125)
    assert (mine is not None) == (cpu_attention.library() is not None)
    if mine is not None:
        assert torch.equal(out, mine)


def test_chunks_outside_the_causal_kernels_contract_go_to_sdpa(fresh_kernel, monkeypatch):
    q, k, v = _chunk(9, 3, 64, 8, 4, 16)
    assert cpu_attention.attend_causal(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125) is None
    assert cpu_attention.attend_causal(*_chunk(4, 2, 40, 8, 0, 8), 0.125) is None  # head size not a multiple of 16
    assert cpu_attention.attend_causal(*_chunk(2, 1, 256, 8, 0, 8), 0.125) is None  # head size over 128
    two = [torch.cat([x, x]) for x in (q, k, v)]
    assert cpu_attention.attend_causal(*two, 0.125) is None  # two sequences
    monkeypatch.setenv("LONGDOC_CPU_ATTENTION", "sdpa")
    cpu_attention._kernel_choice.cache_clear()
    assert cpu_attention.attend_causal(q, k, v, 0.125) is None
