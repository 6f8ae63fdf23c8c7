"""A tiny model with one planted retrieval head: layer 0, query head ``HEAD`` attends
(almost) only to the token ``MARKER``; every other head is random.

How: every token's embedding carries 1.0 in dimension 0, the marker also 1.0 in
dimension 1 (the rest is small noise). Head ``HEAD``'s query reads dimension 0 (a
constant query), its KV head's key reads dimension 1 (large on the marker only),
both in RoPE pair (7, 15), which a huge rope_theta leaves unrotated. The other query
head of that KV group gets a zero query (uniform attention).
"""

from __future__ import annotations

import torch
from finch_testlib import VOCAB, tiny

MARKER = 7
HEAD = 2  # KV group 1 (query heads 2, 3)


def planted_model(dtype: torch.dtype = torch.float64):
    model = tiny("llama", seed=11, dtype=dtype,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e9})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        emb = torch.randn(VOCAB, 64, generator=g, dtype=dtype) * 0.02
        emb[:, 0] = 1.0
        emb[MARKER, 1] = 1.0
        model.model.embed_tokens.weight.copy_(emb)
        attn = model.model.layers[0].self_attn
        d = attn.head_dim
        q = attn.q_proj.weight
        q[HEAD * d : (HEAD + 1) * d] = 0.0
        q[HEAD * d + 7, 0] = 1.5
        other = HEAD ^ 1
        q[other * d : (other + 1) * d] = 0.0
        k = attn.k_proj.weight
        group = HEAD // 2
        k[group * d : (group + 1) * d] = 0.0
        k[group * d + 7, 1] = 1.5
    return model


def doc_with_marker(n: int, at: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(MARKER + 1, VOCAB, (n,), generator=g).tolist()
    ids[at] = MARKER
    return ids
