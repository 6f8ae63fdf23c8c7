"""Capture the post-RoPE queries of a forward pass's last rows, without eager attention.

Contract: ``QueryCapture(attn_modules, layers)``; inside ``with capture.capturing(p_rows):``
one forward pass of the decoder fills ``capture.queries[l]`` ([B, H, P, D], P = p_rows)
for each layer l of ``layers`` (default all): a forward pre-hook on the layer's attention
module projects the layer's input at the last ``p_rows`` positions with the module's own
``q_proj`` and rotates it with the pass's own cos/sin (``position_embeddings``). Only
those rows are projected, so the pass keeps running the model's fast attention kernel
(SDPA / flash): no eager attention over the whole sequence, no ``output_attentions``.
The hooks are removed when the block exits. Needs attention modules with ``q_proj`` and
``head_dim`` that receive ``hidden_states`` and ``position_embeddings`` (Llama, Mistral,
Qwen2 in transformers).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from stages.kv.rope import rotate_half


class QueryCapture:
    """Holds the prompt rows' post-RoPE queries per layer: ``queries[l]`` is [B, H, P, D]
    for each captured layer l (``layers``, default all)."""

    def __init__(self, attn_modules: list[torch.nn.Module], layers: list[int] | None = None) -> None:
        self.modules = attn_modules
        self.layers = list(range(len(attn_modules))) if layers is None else list(layers)
        self.p_rows = 0
        self.queries: dict[int, torch.Tensor] = {}

    def _hook(self, layer: int):
        def pre_hook(module, args, kwargs):
            if self.p_rows == 0:
                return None
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            h = hidden[:, -self.p_rows :]  # [B, P, hidden]
            b, p, _ = h.shape
            q = module.q_proj(h).view(b, p, -1, module.head_dim).transpose(1, 2)  # [B, H, P, D]
            c = cos[:, -self.p_rows :][:, None]  # [B, 1, P, D]
            s = sin[:, -self.p_rows :][:, None]
            self.queries[layer] = q * c + rotate_half(q) * s
            return None

        return pre_hook

    @contextmanager
    def capturing(self, p_rows: int):
        """Capture the last ``p_rows`` rows of each of ``layers`` during one forward pass."""
        self.p_rows = p_rows
        self.queries = {}
        handles = [
            self.modules[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
            for i in self.layers
        ]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.p_rows = 0
