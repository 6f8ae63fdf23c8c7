"""The independent oracle for greedy decoding: transformers' own ``generate``.

Import as ``from hf_oracle import ...`` (pytest puts tests/ on sys.path through the root
conftest). Nothing here imports the project's decoding code: the oracle must not share
the forward path it checks (stages/decoding/state.forward_step, forward.decode_view,
slots, masks).

- ``hf_greedy(model, ids, max_new_tokens, eos_ids)``: ``model.generate`` on ONE row
  (no padding, so no attention-mask or position heuristics are involved): fp32 as the
  model is, greedy (``do_sample=False, num_beams=1``), transformers' own EOS handling
  (``eos_token_id``: a list; the EOS token is kept and ends the row), no compile.
- ``hf_continue(model, state_cache, next_pos, last_logits, ...)``: greedy continuation of
  a cache a method's prefill built (no token ids exist for it: summary vectors, kept
  keys/values at their original positions), one token per transformers forward with
  explicit position ids and transformers' own causal mask over an all-valid cache.
- ``finish_reason(tokens, max_new_tokens, eos_ids)``: the reason our RowResult states
  for such a token list: "eos" when the last token is an EOS id, else "length".
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable

import torch


@torch.inference_mode()
def hf_greedy(model, ids: list[int], max_new_tokens: int, eos_ids: Iterable[int]) -> list[int]:
    """New tokens of transformers' greedy ``generate`` on the single prompt ``ids``."""
    x = torch.tensor([list(ids)], dtype=torch.long, device=model.device)
    eos = sorted(int(e) for e in eos_ids)
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=eos[0],
        disable_compile=True,
    )
    return out[0, x.shape[1] :].tolist()


@torch.inference_mode()
def hf_continue(
    model, cache, next_pos: int, last_logits: torch.Tensor, max_new_tokens: int, eos_ids: Iterable[int]
) -> list[int]:
    """Greedy continuation of one row's prefilled ``cache`` (a transformers DynamicCache,
    batch 1, every slot real) by transformers' forward: the first token is the argmax of
    ``last_logits`` [V], each next one the argmax after feeding the previous token at
    position ``next_pos + i``. The cache is copied, not consumed."""
    eos = {int(e) for e in eos_ids}
    cache = copy.deepcopy(cache)
    tokens = [int(last_logits.argmax())]
    while tokens[-1] not in eos and len(tokens) < max_new_tokens:
        x = torch.tensor([[tokens[-1]]], device=model.device)
        pos = torch.tensor([[next_pos + len(tokens) - 1]], device=model.device)
        out = model(input_ids=x, position_ids=pos, use_cache=True, **{_cache_name(model): cache})
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def _cache_name(model) -> str:
    """The forward keyword for a KV cache in this transformers version (``cache`` from
    5.2x on, ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def finish_reason(tokens: list[int], max_new_tokens: int, eos_ids: Iterable[int]) -> str:
    """"eos" when ``tokens`` ends with an EOS id, else "length" (transformers stops only there)."""
    assert tokens and len(tokens) <= max_new_tokens
    return "eos" if tokens[-1] in set(eos_ids) else "length"
