"""Rotary position embeddings: rotate cached keys to new positions.

RoPE rotates each (i, i + D/2) pair of a head vector by angle ``p * inv_freq[i]``;
rotations compose additively, so a key cached at position ``p_old`` becomes the key
the model would have produced at ``p_new`` by one more rotation by
``(p_new - p_old) * inv_freq``. This holds for every RoPE variant whose angle is
linear in the position with fixed frequencies: ``default``, ``linear`` (frequencies
divided by the factor), ``llama3`` (per-frequency scaling) and ``yarn`` (its
magnitude scale ``attention_scaling`` is already in the cached key, so the extra
rotation uses unit-magnitude cos/sin). ``dynamic`` NTK and ``longrope`` change the
frequencies with the sequence length, so a cached key cannot be moved by a fixed
rotation; those are rejected by ``check_rope``. Finch moves the entries it keeps to
contiguous positions this way.

Convention (Llama, Mistral, Qwen2 in transformers): the frequency vector is
duplicated, ``emb = cat(freqs, freqs)``, and ``x' = x * cos + rotate_half(x) * sin``.
"""

from __future__ import annotations

import torch

from stages.kv.model_parts import rotary_module

#: RoPE variants whose angle is ``position * fixed inv_freq`` (see module docstring).
POSITION_LINEAR_ROPE = ("default", "linear", "llama3", "yarn")


def check_rope(model) -> None:
    """Raise ValueError when the model's RoPE cannot be re-rotated by a fixed angle."""
    rotary = rotary_module(model)
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in POSITION_LINEAR_ROPE:
        raise ValueError(
            f"cannot re-rotate keys for rope_type {rope_type!r} (its frequencies change "
            f"with the sequence length); supported rope types: {', '.join(POSITION_LINEAR_ROPE)}"
        )
    head_dim = int(getattr(model.config.get_text_config(), "head_dim", 0) or 0) or (
        model.config.get_text_config().hidden_size
        // model.config.get_text_config().num_attention_heads
    )
    n_freq = int(rotary.inv_freq.shape[-1])
    if 2 * n_freq != head_dim:
        raise ValueError(
            f"re-rotating keys needs RoPE over the whole head (head_dim {head_dim}), but the "
            f"model rotates {2 * n_freq} dims (partial_rotary_factor < 1 is not supported)"
        )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotation(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit cos/sin for (possibly negative) positions: [...] -> ([..., D], [..., D]) float64."""
    # float64 angles: positions of long documents times high frequencies lose
    # digits in float32 before the cos/sin. cos/sin of the D/2 distinct angles, then
    # duplicated: half the transcendental work of taking them over the duplicated vector.
    angles = positions[..., None].double() * inv_freq.double().to(positions.device)  # [..., D/2]
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def rotate_by(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate post-RoPE ``keys`` [B, H, S, D] by a ``rotation`` (cos/sin broadcastable to
    them): one rotation serves every layer that moves its entries by the same distances.
    Computed in float32 (float64 for float64 keys); returns the keys' dtype."""
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    k = keys.to(work)
    return (k * cos.to(work) + rotate_half(k) * sin.to(work)).to(keys.dtype)


def rerotate(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move post-RoPE keys by ``delta`` positions.

    keys: [B, H, S, D] (any float dtype); delta: [B, H, S] long (broadcastable: [B, 1, 1]
    moves every entry of a row alike at the cost of one [B, 1, 1, D] rotation).
    Returns keys of the same dtype, computed in float32 (float64 for float64 keys) so
    bf16 caches lose no more than one rounding.
    """
    return rotate_by(keys, *rotation(delta, inv_freq))
