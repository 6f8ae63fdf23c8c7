"""The fused CPU norms, activations and RoPE (stages/decoding/cpu_fused.py, .c): transformers'
results within float32 rounding (RoPE: bit for bit), only in a view the caller owns, and
torch's ops otherwise."""

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


from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb  # noqa: E402


@pytest.mark.parametrize("rows,tokens,heads,kv_heads,head_dim", [
    (1, 1060, 9, 3, 64),  # the embedded model's prefill
    (39, 1, 9, 3, 64),  # a decode step of 39 rows
    (3, 7, 4, 2, 48),  # half a head is not a multiple of 16 lanes
    (2, 3, 2, 1, 128),
    (2, 4, 2, 2, 6),
])
def test_rope_equals_transformers_bit_for_bit(kernel, rows, tokens, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(tokens + head_dim)
    # the query and key views transformers makes: projections [B, T, H * D] seen as [B, H, T, D]
    q = (torch.randn(rows, tokens, heads * head_dim, generator=gen) * 5).view(rows, tokens, heads, head_dim).transpose(1, 2)
    k = torch.randn(rows, tokens, kv_heads * head_dim, generator=gen).view(rows, tokens, kv_heads, head_dim).transpose(1, 2)
    cos, sin = (torch.randn(rows, tokens, head_dim, generator=gen) * 3 for _ in range(2))
    fused = cpu_fused.make_apply_rotary_pos_emb(apply_rotary_pos_emb)
    for got, want in zip(fused(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        assert torch.equal(got, want)
        assert got.shape == want.shape
        # the same memory layout (the stride of an axis of one element says nothing)
        assert [st for st, n in zip(got.stride(), got.shape) if n > 1] == [
            st for st, n in zip(want.stride(), want.shape) if n > 1]
    # one position table for every row (cos [1, T, D]) broadcasts as transformers' does
    for got, want in zip(fused(q, k, cos[:1], sin[:1]), apply_rotary_pos_emb(q, k, cos[:1], sin[:1]), strict=True):
        assert torch.equal(got, want)


def test_rope_outside_the_contract_runs_transformers_function(kernel):
    calls = []

    def stock(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(unsqueeze_dim)
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    fused = cpu_fused.make_apply_rotary_pos_emb(stock)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    fused(q.bfloat16(), k.bfloat16(), cos.bfloat16(), sin.bfloat16())  # bf16
    fused(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)  # [B, T, H, D] layout
    fused(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])  # an odd head size
    assert calls == [1, 2, 1]
    fused(q, k, cos, sin)
    assert len(calls) == 3  # in the contract: the kernel


def test_a_fused_attention_is_llamas_forward_bit_for_bit(kernel, tiny_model):
    view = decode_view(tiny_model)
    cpu_fused.fuse_elementwise(view)
    ids = torch.randint(3, 2000, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        h = tiny_model.model.embed_tokens(ids)
        pos = torch.arange(9)[None].expand(2, 9)
        emb = tiny_model.model.rotary_emb(h, pos)
        stock, fused = tiny_model.model.layers[1].self_attn, view.model.layers[1].self_attn
        assert isinstance(fused, LlamaAttention) and fused.q_proj.weight is stock.q_proj.weight
        assert torch.equal(fused(h, position_embeddings=emb)[0], stock(h, position_embeddings=emb)[0])


def test_a_fused_view_computes_transformers_logits_and_leaves_the_model_alone(kernel, tiny_model):
    ids = torch.randint(3, 2000, (2, 7), generator=torch.Generator().manual_seed(2))
    view = decode_view(tiny_model)
    layers = len(tiny_model.model.layers)
    # two norms, an MLP and an attention (its RoPE) per layer, the final norm
    assert cpu_fused.fuse_elementwise(view) == 4 * layers + 1
    assert cpu_fused.fuse_elementwise(view) == 0  # fused already
    assert isinstance(view.model.norm, cpu_fused.FusedRMSNorm)
    assert view.model.norm.weight is tiny_model.model.norm.weight
    assert not any(isinstance(m, (cpu_fused.FusedRMSNorm, cpu_fused.FusedGatedMLP)) for m in tiny_model.modules())
    assert type(view.model.layers[0].self_attn).__name__ == "FusedLlamaAttention"
    assert type(tiny_model.model.layers[0].self_attn).__name__ == "LlamaAttention"
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


def test_rope_is_not_fused_where_transformers_function_computes_another_formula(kernel, monkeypatch, caplog):
    from transformers.models.llama import modeling_llama as llama

    def negated(q, k, cos, sin, unsqueeze_dim=1):  # a future version's formula under the same name
        return apply_rotary_pos_emb(q, k, cos, -sin, unsqueeze_dim)

    assert cpu_fused._agrees(cpu_fused.make_apply_rotary_pos_emb(apply_rotary_pos_emb), apply_rotary_pos_emb)
    assert not cpu_fused._agrees(cpu_fused.make_apply_rotary_pos_emb(negated), negated)
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", negated)  # what Llama's forward reads, too
    with caplog.at_level("WARNING", logger="stages.decoding.cpu_fused"):
        assert cpu_fused._fused_attention_class(llama.LlamaAttention, llama) is None
    assert "RoPE not fused" in caplog.text
