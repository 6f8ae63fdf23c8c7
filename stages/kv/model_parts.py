"""The parts of a causal LM that KV-cache code reaches into.

Contract:
- ``decoder(model)``: the decoder stack (embeddings, layers, norm, rotary embedding) of
  a causal LM: ``get_decoder()`` where the model has it (it sees through wrappers such
  as PEFT's, whose ``base_model_prefix`` attribute is the wrapped causal LM), else the
  attribute named by ``base_model_prefix``. Calling it runs the layers without the LM
  head.
- ``attention_modules(model)``: each decoder layer's self-attention module, in order.
- ``rotary_module(model)``: the decoder's rotary embedding (it holds ``inv_freq``);
  ValueError when the model has none.
- ``text_config(config)``: the text model's config (a multimodal config's text part).
- ``sliding_window(config)``: the attention window the model applies in some layer, or
  None when every layer attends to the whole context.
"""

from __future__ import annotations

import torch


def decoder(model) -> torch.nn.Module:
    """The decoder stack of a causal LM (see the module contract)."""
    get = getattr(model, "get_decoder", None)
    found = get() if callable(get) else None
    return found if found is not None else getattr(model, model.base_model_prefix)


def attention_modules(model) -> list[torch.nn.Module]:
    """Self-attention module of every decoder layer, in layer order."""
    return [layer.self_attn for layer in decoder(model).layers]


def rotary_module(model) -> torch.nn.Module:
    """The rotary embedding module (with ``inv_freq``); ValueError when there is none."""
    rotary = getattr(decoder(model), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise ValueError(f"{type(model).__name__} has no rotary embedding to re-rotate keys with")
    return rotary


def text_config(config):
    """``config``'s text model config: ``get_text_config()`` where it has one, else itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def sliding_window(config) -> int | None:
    """The attention window ``config``'s model applies in any layer, or None for full attention.

    A config can carry a ``sliding_window`` the model does not use (Qwen2 with
    ``use_sliding_window: false``, layer types that are all full attention); only a window
    the model applies counts. Callers that hand the model explicit masks must apply it
    themselves (the decode engine: stages/decoding/forward.py) or fit inside it (Finch).
    """
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)
