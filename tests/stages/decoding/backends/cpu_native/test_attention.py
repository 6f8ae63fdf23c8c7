"""The causal prefill kernel (stages/decoding/backends/cpu_native/attention.py, .c): SDPA's results,
never a later key, SDPA whenever the kernel is not in use, one build per machine.

Every machine with a C compiler runs these: the portable path always (the same binary, no
-march=native), the AVX-512 path where the CPU has it (``FAST``: skipped elsewhere, by name)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from stages.decoding.backends.cpu_native import attention

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the kernel")


def _fast_path() -> bool:
    if shutil.which("cc") is None:
        return False
    return bool(attention.build_library().ld_fast_path())


PATHS = [
    pytest.param(True, id="portable"),
    pytest.param(False, id="avx512", marks=pytest.mark.skipif("not _fast_path()", reason="no AVX-512 on this CPU")),
]


def _run(q, k, v, scale, portable):
    return attention.attend_causal(q, k, v, scale, portable=True) if portable else attention.attend_causal(q, k, v, scale)


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
@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("shape", CHUNKS, ids=lambda s: "x".join(map(str, s)))
def test_the_causal_kernel_gives_sdpas_results(kernel, shape, portable):
    q, k, v = _chunk(*shape)
    out = _run(q, k, v, q.shape[-1] ** -0.5, portable)
    assert out is not None and out.shape == (1, shape[3], shape[0], shape[2]) and out.is_contiguous()
    torch.testing.assert_close(out, _causal_sdpa(q, k, v), atol=3e-6, rtol=0)


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
def test_a_query_never_sees_a_later_key(kernel, portable):
    """NaN in every key and value past the chunk's last token, and in the second half of the
    chunk's own keys/values: the first half of the queries must stay finite."""
    q, clean_k, clean_v = _chunk(9, 3, 64, 40, 10, 64)
    k, v = clean_k.clone(), clean_v.clone()
    k[:, :, 30:], v[:, :, 30:] = float("nan"), float("nan")
    out = _run(q, k, v, 0.125, portable)
    assert torch.isfinite(out[:, :20]).all() and torch.isnan(out[:, 20:]).all()
    torch.testing.assert_close(out[:, :20], _causal_sdpa(q, clean_k, clean_v)[:, :20], atol=3e-6, rtol=0)


@needs_compiler
def test_the_kernel_is_used_only_where_the_cpu_runs_its_fast_path(kernel):
    """In use = AVX-512 (the path the night was measured with); elsewhere SDPA, and the status says why."""
    if _fast_path():
        assert attention.library() is not None and attention.status() == "causal kernel (AVX-512)"
    else:
        assert attention.library() is None and "no AVX-512" in attention.status()
        q, k, v = _chunk(9, 3, 64, 8, 4, 16)
        assert attention.attend_causal(q, k, v, 0.125) is None


def test_sdpa_runs_when_nothing_can_build_the_kernel(fresh_kernel, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert attention.status().startswith("SDPA (no C compiler")
    assert attention.library() is None
    assert not any(fresh_kernel.rglob("*.so"))


@needs_compiler
def test_a_failed_build_falls_back_to_sdpa_and_says_why(fresh_kernel, monkeypatch, tmp_path, caplog):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: this compiler always fails' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level("WARNING"):
        assert "did not build or load" in attention.status()
    assert "always fails" in attention.status()
    assert any(r.levelname == "WARNING" and "always fails" in r.getMessage() for r in caplog.records)


@needs_compiler
def test_the_kernel_is_built_once_per_machine_and_reused(fresh_kernel):
    attention.build_library()
    built = sorted(fresh_kernel.rglob("attention-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    attention._kernel_choice.cache_clear()  # a new process
    attention.build_library()
    assert sorted(fresh_kernel.rglob("attention-*.so")) == built and built[0].stat().st_mtime_ns == stamp
    assert not any(fresh_kernel.rglob("*.tmp"))


@needs_compiler
def test_the_build_does_not_depend_on_the_cpu_it_was_built_on():
    """A portable build: no -march=native (a binary another x86-64 CPU cannot run)."""
    from stages.decoding.backends.cpu_native import build

    assert not any(flag.startswith("-march") for flag in build.FLAGS)


@needs_compiler
def test_chunks_outside_the_causal_kernels_contract_go_to_sdpa(kernel):
    q, k, v = _chunk(9, 3, 64, 8, 4, 16)
    for attend in (lambda *a: attention.attend_causal(*a, portable=True), attention.attend_causal):
        assert attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125) is None
        assert attend(*_chunk(4, 2, 40, 8, 0, 8), 0.125) is None  # head size not a multiple of 16
        assert attend(*_chunk(2, 1, 256, 8, 0, 8), 0.125) is None  # head size over 128
        two = [torch.cat([x, x]) for x in (q, k, v)]
        assert attend(*two, 0.125) is None  # two sequences
