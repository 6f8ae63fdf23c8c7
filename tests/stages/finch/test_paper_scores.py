"""stages/finch/paper_scores.py: the Finch paper's score, against a loop written from its
definition (one prompt row, one head, one softmax at a time)."""

from __future__ import annotations

import pytest
import torch

from stages.finch.paper_scores import prompt_scores

B, H, H_KV, P, S, D = 2, 4, 2, 3, 9, 8
T, F = True, False


def _mask_and_real() -> tuple[torch.Tensor, torch.Tensor]:
    """A causal pass: prompt rows at slots 6, 7, 8; row 1 has two padding slots first and
    its first prompt row is padding (attends only to itself)."""
    mask = torch.zeros(B, P, S, dtype=torch.bool)
    for j in range(P):
        mask[:, j, : S - P + j + 1] = True
    mask[1, :, :2] = False
    mask[1, 0] = False
    mask[1, 0, S - P] = True
    real = torch.tensor([[T, T, T], [F, T, T]])
    return mask, real


def _reference(q, k, mask, real, scaling, head_mode) -> torch.Tensor:
    out = torch.zeros(B, H_KV, S, dtype=torch.float64)
    for b in range(B):
        for j in range(P):
            if not real[b, j]:
                continue
            seen = mask[b, j]
            for h in range(H):
                kv = h // (H // H_KV)
                logits = (k[b, kv] @ q[b, h, j]) * scaling
                a = torch.softmax(logits.masked_fill(~seen, float("-inf")), dim=-1)
                out[b, kv] += int(seen.sum()) * a  # n_j * a: relative to uniform attention
    return out.sum(dim=1, keepdim=True) if head_mode == "sum" else out


@pytest.mark.parametrize("head_mode", ["sum", "kv_group"])
def test_scores_match_the_definition(head_mode: str):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, P, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H_KV, S, D, generator=g, dtype=torch.float64)
    mask, real = _mask_and_real()
    got = prompt_scores(q, k, mask, real, D**-0.5, head_mode)
    assert got.shape == (B, 1 if head_mode == "sum" else H_KV, S) and got.dtype == torch.float64
    torch.testing.assert_close(got, _reference(q, k, mask, real, D**-0.5, head_mode))
    assert (got[1, :, :2] == 0).all()  # padding slots get nothing


def test_uniform_attention_scores_each_slot_by_the_prompt_rows_that_see_it():
    """n_j * a puts every prompt row on one scale: with zero queries (uniform attention)
    a slot scores 1 per head per real prompt row that attends to it."""
    mask, real = _mask_and_real()
    got = prompt_scores(torch.zeros(B, H, P, D), torch.randn(B, H_KV, S, D), mask, real, 1.0, "sum")
    want = H * (mask & real[:, :, None]).sum(dim=1).float()  # [B, S]
    torch.testing.assert_close(got[:, 0], want)
    assert got.dtype == torch.float32
    assert got[0, 0, :6].tolist() == [12.0] * 6  # document slots: all 3 rows x 4 heads
    assert got[1, 0, 2:6].tolist() == [8.0] * 4  # row 1: 2 real prompt rows x 4 heads


def test_bf16_inputs_are_scored_in_float32():
    """A bf16 cache loses nothing more than its own rounding: the scores are those of the
    same (rounded) numbers in float32."""
    mask, real = _mask_and_real()
    q, k = torch.randn(B, H, P, D).bfloat16(), torch.randn(B, H_KV, S, D).bfloat16()
    half = prompt_scores(q, k, mask, real, 0.3, "sum")
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, prompt_scores(q.float(), k.float(), mask, real, 0.3, "sum"))


def test_unknown_head_mode_names_the_allowed_ones():
    mask, real = _mask_and_real()
    with pytest.raises(ValueError, match="'sum' or 'kv_group', got 'max'"):
        prompt_scores(torch.randn(B, H, P, D), torch.randn(B, H_KV, S, D), mask, real, 1.0, "max")
