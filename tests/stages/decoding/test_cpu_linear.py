"""The CPU linear kernel (stages/decoding/cpu_linear.py, .c): BLAS's products from packed
weights for every row count and ragged shape, and the BLAS whenever the kernel is not in use."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from stages.decoding import cpu_linear


@pytest.fixture
def kernel(fresh_kernel):
    if shutil.which("cc") is None or not cpu_linear.available():
        pytest.skip(f"the packed kernel is not in use here: {cpu_linear.status()}")


# (N, K, M): N not a multiple of the 32-column panel, K odd, M across one tile (12 rows),
# uneven tiles (13 = 7 + 6, 39 = 10 + 10 + 10 + 9) and the largest routed size.
SHAPES = [(64, 48, 1), (50, 37, 5), (96, 64, 12), (33, 64, 13), (576, 192, 39), (17, 16, 100), (130, 96, 256)]


@pytest.mark.parametrize("n,k,m", SHAPES, ids=lambda v: str(v))
def test_packed_products_equal_blas_within_float32_rounding(kernel, n, k, m):
    gen = torch.Generator().manual_seed(n * k + m)
    w = torch.randn(n, k, generator=gen)
    wide = torch.randn(m, k + 7, generator=gen)
    x = wide[:, 3 : 3 + k]  # rows with a stride larger than K, as a view's slice has
    packed = cpu_linear.pack(w)
    assert packed.shape == ((n + 31) // 32, k, 32)
    y = cpu_linear.linear(x, packed, n)
    assert y.shape == (m, n)
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5 * k**0.5)


def test_packing_leaves_the_weight_alone_and_pads_with_zeros(kernel):
    w = torch.randn(40, 8)
    before = w.clone()
    packed = cpu_linear.pack(w)
    assert torch.equal(w, before)
    assert torch.equal(packed[0], w[:32].t()) and torch.equal(packed[1, :, :8], w[32:].t())
    assert not packed[1, :, 8:].any()  # columns past N are zero


def test_outside_the_contract_pack_says_none_and_linear_refuses(kernel):
    assert cpu_linear.pack(torch.randn(64, 32).bfloat16()) is None
    assert cpu_linear.pack(torch.randn(64)) is None
    packed = cpu_linear.pack(torch.randn(64, 32))
    with pytest.raises(ValueError, match="does not fit"):
        cpu_linear.linear(torch.randn(3, 16), packed, 64)  # K 16 against a packed K of 32
    with pytest.raises(ValueError, match="does not fit"):
        cpu_linear.linear(torch.randn(3, 32), packed, 65)  # more columns than were packed


def test_the_blas_runs_when_asked_and_says_why(fresh_kernel, monkeypatch):
    monkeypatch.setenv("LONGDOC_CPU_LINEAR", "blas")
    assert cpu_linear.status() == "BLAS (LONGDOC_CPU_LINEAR=blas)"
    assert not cpu_linear.available() and cpu_linear.pack(torch.randn(64, 32)) is None
    with pytest.raises(RuntimeError, match="not in use"):
        cpu_linear.linear(torch.randn(2, 32), torch.zeros(2, 32, 32), 64)
    monkeypatch.delenv("LONGDOC_CPU_LINEAR")
    cpu_linear._kernel_choice.cache_clear()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert cpu_linear.status().startswith("BLAS (no C compiler")


def test_two_threads_split_the_panels_and_give_the_same_products(kernel):
    w, x = torch.randn(200, 64), torch.randn(39, 64)
    packed = cpu_linear.pack(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = cpu_linear.linear(x, packed, 200)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(two, cpu_linear.linear(x, packed, 200))  # each output is one thread's, in k order
