"""The fused CPU norms and activations (stages/decoding/cpu_fused.py, .c): transformers'
results within float32 rounding, only in a view the caller owns, and torch's ops otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.decoding import cpu_fused
from stages.decoding.forward import decode_view


@pytest.fixture
def kernel(fresh_kernel):
    if cpu_fused._kernel_choice()[0] is None:
        pytest.skip(f"the fused kernels are not in use here: {cpu_fused.status()}")


@pytest.mark.parametrize("rows,dim", [(1, 16), (5, 37), (64, 576)])
def test_rms_norm_equals_transformers_formula(kernel, rows, dim):
    gen = torch.Generator().manual_seed(dim)
    wide = torch.randn(rows, dim + 3, generator=gen) * 4
    x = wide[:, 1 : 1 + dim]  # rows with a stride larger than dim
    w = torch.randn(dim, generator=gen)
    want = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(cpu_fused.rms_norm(x, w, 1e-5), want, rtol=2e-6, atol=1e-6)
    x3 = torch.randn(2, 3, dim, generator=gen)  # leading axes are kept
    assert cpu_fused.rms_norm(x3, w, 1e-5).shape == (2, 3, dim)


def test_silu_mul_equals_torch_over_the_whole_range(kernel):
    gen = torch.Generator().manual_seed(0)
    g = torch.cat([torch.randn(1000, generator=gen) * 6, torch.tensor([0.0, -0.0, 80.0, -80.0, 100.0, -100.0, 1e-8])])
    u = torch.randn(g.numel(), generator=gen)
    got = cpu_fused.silu_mul(g, u)
    torch.testing.assert_close(got, F.silu(g) * u, rtol=2e-6, atol=1e-30)
    assert torch.isfinite(got).all()


def test_a_fused_view_computes_transformers_logits_and_leaves_the_model_alone(kernel, tiny_model):
    ids = torch.randint(3, 2000, (2, 7), generator=torch.Generator().manual_seed(2))
    view = decode_view(tiny_model)
    layers = len(tiny_model.model.layers)
    assert cpu_fused.fuse_elementwise(view) == 3 * layers + 1  # two norms and an MLP per layer, the final norm
    assert cpu_fused.fuse_elementwise(view) == 0  # fused already
    assert isinstance(view.model.norm, cpu_fused.FusedRMSNorm)
    assert view.model.norm.weight is tiny_model.model.norm.weight
    assert not any(isinstance(m, (cpu_fused.FusedRMSNorm, cpu_fused.FusedGatedMLP)) for m in tiny_model.modules())
    with torch.inference_mode():
        torch.testing.assert_close(view(ids).logits, tiny_model(ids).logits, rtol=1e-5, atol=1e-5)
        h = torch.randn(3, tiny_model.config.hidden_size).bfloat16()  # outside the contract: the stock forward
        norm = tiny_model.model.norm.to(torch.bfloat16)
        try:
            assert torch.equal(view.model.norm(h), norm(h))
        finally:
            norm.to(torch.float32)


def test_torch_ops_run_when_asked_and_say_why(fresh_kernel, monkeypatch, tiny_model):
    monkeypatch.setenv("LONGDOC_CPU_FUSED", "torch")
    assert cpu_fused.status() == "torch ops (LONGDOC_CPU_FUSED=torch)"
    assert cpu_fused.fuse_elementwise(decode_view(tiny_model)) == 0


def test_only_llamas_own_norm_and_mlp_code_is_fused(kernel, tiny_model):
    class OnePlusWeightRMSNorm(torch.nn.Module):  # Gemma's formula under an RMSNorm name
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    other = torch.nn.Sequential(OnePlusWeightRMSNorm())
    assert cpu_fused.fuse_elementwise(other) == 0
    view = decode_view(tiny_model)
    assert cpu_fused.fuse_elementwise(view) > 0  # Llama's own classes are
