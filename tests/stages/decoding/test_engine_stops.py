"""Stop strings end a row at the exact token, even inside a chunk of accepted drafts."""

from __future__ import annotations

import copy

import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full


def test_stop_string_inside_accepted_drafts(tiny_model, tiny_engine, tokenizer):
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(300, 3000, (n,), generator=g).tolist() for n in (8, 15)]
    plain = DecodeConfig(max_new_tokens=20, eos_ids=frozenset({-1}))
    runs = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), plain)]
    # A stop string first completed by a token well inside some row's output.
    row, stop = next(
        (r, text) for r in range(len(runs)) for i in range(3, 16)
        if len(text := tokenizer.decode(runs[r][i : i + 1]).strip()) >= 2
        and text not in tokenizer.decode(runs[r][:i])
    )
    cfg = DecodeConfig(
        max_new_tokens=20, eos_ids=frozenset({-1}), stop_strings=(stop,),
        speculative="prompt_lookup", num_draft_tokens=8, adaptive=False,
    )
    state = prefill_full(tiny_model, prompts, 0)
    ref = decode_plain(tiny_model, copy.deepcopy(state), cfg, decode=tokenizer.decode)
    lookup = [p + r for p, r in zip(prompts, runs, strict=True)]  # drafts = the continuation
    out = decode(tiny_engine, state, lookup, cfg, decode_text=tokenizer.decode)
    assert ref[row].finish_reason == "stop" and 3 < len(ref[row].tokens) < 17
    for a, b in zip(ref, out, strict=True):
        assert (b.tokens, b.finish_reason) == (a.tokens, a.finish_reason)
    assert out[row].accepted_tokens > 0
