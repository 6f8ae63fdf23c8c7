"""The packed linear kernel (stages/decoding/backends/cpu_native/linear.py, .c): the BLAS's
products from packed weights for every row count and ragged shape; the BLAS whenever the
kernel is not in use. The portable path runs on every machine with a C compiler, the AVX-512
path where the CPU has it (skipped elsewhere, by name)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from stages.decoding.backends.cpu_native import linear

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the kernel")


def _fast_path() -> bool:
    return shutil.which("cc") is not None and bool(linear.build_library().ld_fast_path())


PATHS = [
    pytest.param(True, id="portable"),
    pytest.param(False, id="avx512", marks=pytest.mark.skipif("not _fast_path()", reason="no AVX-512 on this CPU")),
]

# (N, K, M): N not a multiple of the 32-column panel, K odd, M across one tile (12 rows),
# uneven tiles (13 = 7 + 6, 39 = 10 + 10 + 10 + 9) and the largest routed size.
SHAPES = [(64, 48, 1), (50, 37, 5), (96, 64, 12), (33, 64, 13), (576, 192, 39), (17, 16, 100), (130, 96, 256)]


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("n,k,m", SHAPES, ids=lambda v: str(v))
def test_packed_products_equal_blas_within_float32_rounding(kernel, n, k, m, portable):
    gen = torch.Generator().manual_seed(n * k + m)
    w = torch.randn(n, k, generator=gen)
    wide = torch.randn(m, k + 7, generator=gen)
    x = wide[:, 3 : 3 + k]  # rows with a stride larger than K, as a view's slice has
    packed = linear.pack(w, portable=portable)
    assert packed.shape == ((n + 31) // 32, k, 32)
    y = linear.linear(x, packed, n, portable=portable)
    assert y.shape == (m, n)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5 * k**0.5)


@needs_compiler
def test_packing_leaves_the_weight_alone_and_pads_with_zeros(kernel):
    w = torch.randn(40, 8)
    before = w.clone()
    packed = linear.pack(w, portable=True)
    assert torch.equal(w, before)
    assert torch.equal(packed[0], w[:32].t()) and torch.equal(packed[1, :, :8], w[32:].t())
    assert not packed[1, :, 8:].any()  # columns past N are zero


@needs_compiler
def test_outside_the_contract_pack_says_none_and_linear_refuses(kernel):
    assert linear.pack(torch.randn(64, 32).bfloat16(), portable=True) is None
    assert linear.pack(torch.randn(64), portable=True) is None
    packed = linear.pack(torch.randn(64, 32), portable=True)
    with pytest.raises(ValueError, match="does not fit"):
        linear.linear(torch.randn(3, 16), packed, 64, portable=True)  # K 16 against a packed K of 32
    with pytest.raises(ValueError, match="does not fit"):
        linear.linear(torch.randn(3, 32), packed, 65, portable=True)  # more columns than were packed


def test_the_kernel_is_used_only_where_the_cpu_runs_its_fast_path(kernel):
    """In use = AVX-512; elsewhere (or with no compiler) the BLAS, and the status says why."""
    if _fast_path():
        assert linear.available() and linear.status() == "packed kernel (AVX-512)"
    else:
        assert not linear.available() and linear.status().startswith("BLAS (")
        assert linear.pack(torch.randn(64, 32)) is None
        with pytest.raises(RuntimeError, match="not in use"):
            linear.linear(torch.randn(2, 32), torch.zeros(2, 32, 32), 64)


def test_the_blas_runs_when_nothing_can_build_the_kernel(fresh_kernel, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert linear.status().startswith("BLAS (no C compiler")
    assert not linear.available() and linear.pack(torch.randn(64, 32)) is None


@needs_compiler
@pytest.mark.parametrize("portable", PATHS)
def test_two_threads_split_the_panels_and_give_the_same_products(kernel, portable):
    w, x = torch.randn(200, 64), torch.randn(39, 64)
    packed = linear.pack(w, portable=portable)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = linear.linear(x, packed, 200, portable=portable)
        torch.set_num_threads(1)
        one = linear.linear(x, packed, 200, portable=portable)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(two, one)  # each output is one thread's, summed in k order
