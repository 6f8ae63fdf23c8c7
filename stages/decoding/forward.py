"""The engine's model view and its attention: GQA attention without copies.

``decode_view(model, attention)``: the model a step backend runs. A copy of the module
tree that shares every parameter and buffer with ``model`` (no weight is copied) and
has its own config, in which an ``sdpa`` model attends through ``attention`` (default
``packed_gqa_sdpa``; a backend may wrap it: backends/). The caller's model is never
touched: its modules, forwards and config are the same before, during and after decoding.

Why packed GQA: with a mask and more than one query token, transformers' SDPA path
repeats every key/value head ``n_rep`` times (a copy of the whole cache per layer
per step); we instead fold the ``n_rep`` query heads that share a KV head into the
query-length axis and tile the (head-independent) mask, which is the same
arithmetic without the copy.

Sliding windows (Gemma 2/3, Mistral, Qwen2's windowed layers): transformers passes a layer's
window as the ``sliding_window`` keyword (None in full-attention layers), and the engine
hands every layer one mask, so the window is applied here (``windowed``): a query sees the
keys within ``sliding_window`` slots of its own, the model's own rule (distance <
window). This relies on the engine's layout: a row's slots hold its tokens in order with
no holes, and a query's own slot is the last one its mask shows (slot_step.py). A prefill
chunk's windowed layers read only the keys within its first query's window. The slots
keep every token of a windowed layer (a ring per layer would hold less, but spans, prefix
copies and the C kernels all read slots in token order).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from stages.kv.model_parts import sliding_window, text_config


def packed_gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [B, Hq, T, D], key/value [B, Hkv, S, D], mask [B, 1, T, L] bool -> [B, T, Hq, D].

    A mask narrower than the keys (L < S) attends over the first L key slots only: the
    static engine's steps pass a span of its slots that covers every active row
    (slot_step.py), so attention reads the filled part of the cache, not its capacity.
    """
    if attention_mask is not None:
        # Slicing to the mask's width is a no-op view when L == S; no branch on L < S, so
        # a compiled step keeps one graph for every span.
        span = attention_mask.shape[-1]
        key, value = key[:, :, :span], value[:, :, :span]
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:  # a window as wide as the span changes nothing
        window = int(window)
        if attention_mask is None:
            # A prefill chunk's T queries sit at the last T slots: keys before the first one's
            # window are never seen, so they are not read (a long prompt's windowed layers
            # attend over T + window keys, not the whole prompt so far).
            start = max(0, key.shape[2] - query.shape[2] - window + 1)
            key, value = key[:, :, start:], value[:, :, start:]
        attention_mask = windowed(attention_mask, window, query.shape[2], key.shape[2], query.device)
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    rep = hq // hkv
    # Query head h = g * rep + r uses KV head g; rows (r, t) of group g become one axis.
    q = query.reshape(b, hkv, rep * t, d)  # [B, Hkv, rep*T, D]
    mask = attention_mask
    if mask is None and t > 1:
        # transformers builds no mask for an attention name it does not know: the
        # causal mask of T new queries over S keys (a prefill chunk; decode steps pass their own).
        s = key.shape[2]
        if s == t:
            # A first chunk: plain causal attention. SDPA's causal kernel with grouped
            # heads needs no mask tensor, and was faster than a masked call on CPU
            # (measured: jobs/results/code-choices.md, "stages/decoding/forward.py").
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
            return out.transpose(1, 2).contiguous(), None
        mask = torch.ones(t, s, dtype=torch.bool, device=query.device).tril(s - t)[None, None]  # [1, 1, T, S]
    if mask is not None and rep > 1:
        mask = mask.repeat(1, 1, rep, 1)  # [B, 1, rep*T, S]; row r*T + t is mask row t
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, hq, t, d).transpose(1, 2).contiguous(), None


def windowed(mask: torch.Tensor | None, window: int, t: int, s: int, device: torch.device) -> torch.Tensor:
    """The mask [B, 1, T, L] bool (or None: T new queries at the last T of S slots, causal)
    narrowed to a sliding window: query at slot q keeps key j iff q - window < j <= q.

    A given mask's query slot is its row's last visible slot (the engine's causal slot
    layout, see the module doc); a row of padding that sees only itself keeps itself.
    Returns [B, 1, T, L] (or [1, 1, T, S] for None)."""
    if mask is None:
        rows = torch.arange(s - t, s, device=device)[:, None]  # [T, 1] query slots
        cols = torch.arange(s, device=device)[None]  # [1, S]
        return ((cols <= rows) & (cols > rows - window))[None, None]
    cols = torch.arange(mask.shape[-1], device=mask.device)  # [L]
    last = torch.where(mask, cols, -1).amax(dim=-1, keepdim=True)  # [B, 1, T, 1] each query's slot
    return mask & (cols > last - window)


def attention_name(attention: Callable) -> str:
    """The name ``attention`` is installed under (unique per function)."""
    return f"longdoc:{attention.__module__}.{attention.__qualname__}"


def install_attention(view: torch.nn.Module, attention: Callable) -> str:
    """Make ``view`` (and only it) attend through ``attention``; returns the name used.

    transformers finds a model's attention by the name in its config
    (``config._attn_implementation``, looked up in its AttentionInterface), so the function
    is entered in that table under a name of its own, when a backend first installs it (never
    at import), and only the view's config names it: every other model, the caller's
    included, keeps the attention it had."""
    name = attention_name(attention)
    AttentionInterface.register(name, attention)  # idempotent: the same name, the same function
    view.config._attn_implementation = name
    return name


def check_engine_model(model: torch.nn.Module) -> None:
    """ValueError, naming the setting and the fix, for a model whose arithmetic the engine's
    steps would change: logit soft-capping (Gemma 2: neither the engine's attention nor its
    head applies it), or sliding windows under an attention other than SDPA (only the
    engine's own SDPA attention applies the window: ``windowed``)."""
    cfg = text_config(model.config)
    name = getattr(cfg, "model_type", type(model).__name__)
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, field, None):
            raise ValueError(
                f"the decode engine does not apply logit soft-capping ({name}: {field}={getattr(cfg, field)}); "
                "use a model without it (e.g. Gemma 3 instead of Gemma 2)"
            )
    attn = getattr(model.config, "_attn_implementation", None)
    if sliding_window(cfg) is not None and attn != "sdpa":
        raise ValueError(
            f"{name} attends within sliding windows, which the decode engine applies in its SDPA "
            f"attention only; the model was loaded with attn_implementation={attn!r}: load it with 'sdpa'"
        )


def decode_view(model: torch.nn.Module, attention: Callable = packed_gqa_sdpa) -> torch.nn.Module:
    """A copy of ``model`` sharing its weights, attending through ``attention``, for a step
    backend to own (see module doc).

    ``copy.deepcopy`` with every parameter and buffer pre-entered in the memo copies
    the module objects and the config but maps each tensor to itself, so tied
    weights stay tied and in-place weight updates of ``model`` show in the view. Only an
    ``sdpa`` model gets ``attention``: eager/flash/custom are the user's choice and stand.
    """
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    view = copy.deepcopy(model, shared)
    if getattr(view.config, "_attn_implementation", None) == "sdpa":
        install_attention(view, attention)
    return view.eval()


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """``{name: cache}`` for calling ``model`` with a KV cache, in the name its transformers
    version takes: ``cache`` (transformers >= 5.2x, where ``past_key_values`` is deprecated
    and warns) or ``past_key_values`` (older versions, e.g. the GPU machine's 5.17).
    (A signature lookup, ~10 us: cheap beside any forward pass, and no process-wide memo.)"""
    params = inspect.signature(type(model).forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}
