"""Query capture: the post-RoPE queries of a pass's last rows, as eager attention computes them."""

from __future__ import annotations

import torch
from tiny_models import tiny_causal_lm

from stages.kv.model_parts import attention_modules, decoder
from stages.kv.queries import QueryCapture
from stages.kv.rope import rotate_half


def test_captured_queries_equal_the_projected_rotated_rows():
    model = tiny_causal_lm(512, "llama", 0, torch.float32)
    attn = attention_modules(model)
    capture = QueryCapture(attn, [1])
    seen = {}
    hook = attn[1].register_forward_pre_hook(
        lambda m, a, kw: seen.update(h=kw["hidden_states"], pe=kw["position_embeddings"]), with_kwargs=True)
    ids = torch.tensor([list(range(5, 17))])
    with torch.no_grad(), capture.capturing(3):
        decoder(model)(input_ids=ids)
    hook.remove()
    assert list(capture.queries) == [1]  # only the layers asked for
    q = attn[1].q_proj(seen["h"][:, -3:]).view(1, 3, -1, attn[1].head_dim).transpose(1, 2)
    cos, sin = (t[:, -3:][:, None] for t in seen["pe"])
    torch.testing.assert_close(capture.queries[1], q * cos + rotate_half(q) * sin)
    assert not attn[1]._forward_pre_hooks  # hooks removed after the block
    with torch.no_grad():
        decoder(model)(input_ids=ids)  # outside the block nothing is captured
    assert capture.p_rows == 0
