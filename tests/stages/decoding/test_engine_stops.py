"""Stop strings end a row at the exact token, even inside a chunk of accepted drafts."""

from __future__ import annotations

import copy

import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.state import prefill_full
from stages.decoding.stops import StopChecker, cut_text
from stages.prompting import PromptParts


def test_stop_string_inside_accepted_drafts(tiny_model, tokenizer):
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
    eng = Engine(tiny_model, cfg, decode_text=tokenizer.decode, slots=2, expected_tokens=16)
    out = [o.result for o in eng.run(Request(i, PromptParts([], p, []), lk) for i, (p, lk) in enumerate(zip(prompts, lookup)))]
    assert ref[row].finish_reason == "stop" and 3 < len(ref[row].tokens) < 17
    for a, b in zip(ref, out, strict=True):
        assert (b.tokens, b.finish_reason) == (a.tokens, a.finish_reason)
    assert out[row].accepted_tokens > 0


def test_stop_checker_eos_length_and_text_cut():
    stop = StopChecker(frozenset({9}), max_new_tokens=5)
    assert stop.scan([1, 2, 9, 4], 0) == (3, "eos")  # EOS is kept, what follows it is not
    assert stop.scan([1, 2, 3, 4, 5, 6], 2) == (5, "length")
    assert stop.scan([1, 2], 0) == (2, None)
    words = {1: "ab", 2: "c", 3: "END", 4: "x"}
    text = StopChecker(frozenset(), 10, ("cEN",), decode=lambda ids: "".join(words[i] for i in ids))
    assert text.scan([1, 2, 3, 4], 0) == (3, "stop")  # the token completing the string is kept
    assert cut_text("abcENDx", ("cEN",)) == "ab"
    try:
        StopChecker(frozenset(), 4, ("x",))
    except ValueError as e:
        assert "decode function" in str(e)
    else:
        raise AssertionError("stop strings without a decode function must raise")


def test_repeat_guard_keeps_one_cycle_of_a_loop_shorter_than_its_ngram():
    """A 12-token guard caught "the audit report," (5 tokens) three cycles in and kept all
    three: the cut now goes back to the loop's first cycle."""
    guard = StopChecker(frozenset(), max_new_tokens=200, repeat_ngram=12)
    pre, cycle = [1, 2, 3], [7, 8, 9, 10, 11]
    tokens = pre + cycle * 8
    keep, reason = guard.scan(tokens, 0)
    assert reason == "repeat" and tokens[:keep] == pre + cycle
    # A sentence repeated after other text is no short loop: cut before its second telling.
    sentence = list(range(20, 34))
    tokens = [1, 2] + sentence + [40, 41, 42] + sentence + [50]
    assert guard.scan(tokens, 0) == (2 + 14 + 3, "repeat")
    # Seen token by token (as decode appends them), the cut is the same.
    tokens = pre + cycle * 8
    cuts = [guard.scan(tokens[: k + 1], k) for k in range(len(tokens))]
    assert next(c for c in cuts if c[1]) == (len(pre) + len(cycle), "repeat")


def test_repeat_guard_cuts_a_loop_identically_with_and_without_drafts(tiny_model):
    """A tiny model that loops (greedy on a repeated prompt): the guard stops each row where its
    output first repeats itself, keeping a prefix of plain greedy's output, and prompt lookup
    (which drafts exactly such repeats) stops at the same token."""
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(3, 50, (6,), generator=g).tolist() * 4 for _ in range(3)]
    plain = DecodeConfig(max_new_tokens=40, eos_ids=frozenset({-1}))
    runs = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), plain)]
    guarded = DecodeConfig(max_new_tokens=40, eos_ids=frozenset({-1}), repeat_ngram=4)
    ref = decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), guarded)
    assert any(r.finish_reason == "repeat" for r in ref), "the tiny model should loop on these prompts"
    for r, full in zip(ref, runs, strict=True):
        assert full[: len(r.tokens)] == r.tokens  # a prefix of plain greedy
        if r.finish_reason == "repeat":  # no 4-gram occurs twice in what is kept
            grams = [tuple(r.tokens[i : i + 4]) for i in range(len(r.tokens) - 3)]
            assert len(grams) == len(set(grams))
    for method in ("none", "prompt_lookup", "suffix"):
        cfg = DecodeConfig(max_new_tokens=40, eos_ids=frozenset({-1}), repeat_ngram=4, speculative=method,
                           num_draft_tokens=6, adaptive=False)
        eng = Engine(tiny_model, cfg, slots=2, expected_tokens=32)
        out = eng.run(Request(i, PromptParts([], p, []), p + runs[i]) for i, p in enumerate(prompts))
        assert [(o.result.tokens, o.result.finish_reason) for o in out] == [(r.tokens, r.finish_reason) for r in ref]
