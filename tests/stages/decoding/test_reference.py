"""The plain reference decoder (stages/decoding/reference.py) against transformers'
``generate`` (tests/hf_oracle.py): the reference other tests compare the engine with is
itself checked by an oracle that shares none of its code, on a left-padded batch of
mixed lengths where rows finish at different steps and ride along as padding."""

from __future__ import annotations

import copy

import torch
from hf_oracle import finish_reason, hf_greedy

from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full

LENGTHS = (4, 19, 1, 33, 9)
MAX_NEW = 16


def _setup(tiny_llama_factory):
    model = tiny_llama_factory(400, seed=8, initializer_range=0.2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 400, (n,), generator=g).tolist() for n in LENGTHS]
    return model, prompts


def test_greedy_batch_equals_generate_row_by_row(tiny_llama_factory):
    model, prompts = _setup(tiny_llama_factory)
    free = hf_greedy(model, prompts[0], MAX_NEW, [0])
    eos = frozenset({next(t for i, t in enumerate(free) if i >= 5 and t not in free[:i])})  # ends row 0 mid-way
    want = [hf_greedy(model, p, MAX_NEW, eos) for p in prompts]
    got = decode_plain(model, prefill_full(model, prompts, pad_id=0), DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=eos))
    assert [r.tokens for r in got] == want
    assert [r.finish_reason for r in got] == [finish_reason(w, MAX_NEW, eos) for w in want]
    assert got[0].finish_reason == "eos" and len(got[0].tokens) < MAX_NEW
    assert [r.decode_steps for r in got] == [len(w) - 1 for w in want]  # the first token comes from the prefill


def test_sampling_draws_a_row_the_same_alone_and_in_a_batch(tiny_llama_factory):
    model, prompts = _setup(tiny_llama_factory)
    cfg = DecodeConfig(max_new_tokens=MAX_NEW, eos_ids=frozenset({-1}), temperature=0.9, top_p=0.9)
    seeds = [11, 12, 13, 14, 15]
    state = prefill_full(model, prompts, pad_id=0)
    batch = decode_plain(model, copy.deepcopy(state), cfg, seeds)
    alone = decode_plain(model, prefill_full(model, prompts[3:4], pad_id=0), cfg, seeds[3:4])
    assert alone[0].tokens == batch[3].tokens
    again = decode_plain(model, state, cfg, [11, 12, 13, 99, 15])
    assert again[0].tokens == batch[0].tokens and again[3].tokens != batch[3].tokens
