"""Key re-rotation: moving a cached key equals computing it at the new position."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_causal_lm

from stages.kv.model_parts import rotary_module
from stages.kv.rope import check_rope, rerotate, rotate_by, rotation


def tiny(family: str = "llama", dtype: torch.dtype = torch.float64, **overrides):
    return tiny_causal_lm(512, family, 0, dtype, **overrides)


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 512,
    },
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 512},
}


@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rerotated_keys_equal_keys_at_new_positions(rope: str, dtype: torch.dtype) -> None:
    model = tiny("llama", dtype=torch.float32, rope_parameters=ROPES[rope])
    check_rope(model)
    attn = model.model.layers[0].self_attn
    rotary = rotary_module(model)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 64, generator=g)
    old = torch.tensor([[5, 9, 30, 31, 700, 3000], [0, 1, 2, 3, 4, 5]])
    new = torch.tensor([[3, 4, 5, 6, 7, 8], [10, 11, 12, 13, 4000, 6]])

    def keys_at(pos: torch.Tensor) -> torch.Tensor:
        k = attn.k_proj(hidden).view(2, 6, -1, attn.head_dim).transpose(1, 2)  # [B, Hkv, S, D]
        cos, sin = rotary(k, pos)
        half = k.shape[-1] // 2
        rot = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        return k * cos[:, None] + rot * sin[:, None]

    with torch.no_grad():
        moved = rerotate(keys_at(old).to(dtype), (new - old)[:, None], rotary.inv_freq)
        direct = keys_at(new)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(moved.float(), direct, atol=tol, rtol=tol)


def test_dynamic_rope_is_rejected() -> None:
    model = tiny("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match="dynamic"):
        check_rope(model)


def test_one_rotation_per_row_moves_every_entry_alike() -> None:
    """A [B, 1, 1] delta (one rotation per row, broadcast over heads and slots) equals the
    same delta written out per entry, and rotate_by with a shared rotation equals rerotate."""
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(2, 3, 5, 8, generator=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    delta = torch.tensor([7, -3])[:, None, None]
    full = rerotate(keys, delta.expand(2, 3, 5), inv_freq)
    torch.testing.assert_close(rerotate(keys, delta, inv_freq), full, rtol=0, atol=0)
    torch.testing.assert_close(rotate_by(keys, *rotation(delta, inv_freq)), full, rtol=0, atol=0)
