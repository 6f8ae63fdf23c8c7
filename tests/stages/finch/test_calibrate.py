"""Calibration finds a planted retrieval head; needle prompts are exact."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import random_parts
from planted import HEAD, doc_with_marker, planted_model

from stages.finch.calibrate import (
    PLACES,
    TEMPLATES,
    NeedlePrompt,
    answer_share,
    is_paraphrased,
    needle_prompts,
    pick_heads,
)
from stages.prompting import PromptBuilder, PromptParts


def _prompts(n: int) -> list[NeedlePrompt]:
    out = []
    for i in range(n):
        frame = random_parts([(5, 0, 9)], seed=100 + i)[0]
        at = 10 + 13 * i
        doc = doc_with_marker(120, at, seed=i)
        out.append(NeedlePrompt(PromptParts(frame.prefix_ids, doc, frame.query_ids), (at, at + 1)))
    return out


def test_answer_share_ranks_the_planted_head_first() -> None:
    model = planted_model()
    share = answer_share(model, _prompts(4))  # [L, H]
    assert share.shape == (2, 4)
    assert pick_heads(share, 1) == ((0, HEAD),)
    assert share[0, HEAD] > 0.9  # nearly all its document attention is on the marker
    uniform = 1 / 120
    others = [float(share[la, h]) for la in range(2) for h in range(4) if (la, h) != (0, HEAD)]
    assert max(others) < 0.5
    assert share[0, HEAD ^ 1] == pytest.approx(uniform, rel=0.2)  # zero query: uniform


def test_pick_heads_order_depth_and_bad_values() -> None:
    share = torch.tensor([[0.1, 0.5], [0.3, 0.2], [0.9, 0.0]])
    assert pick_heads(share, 3) == ((2, 0), (0, 1), (1, 0))
    assert pick_heads(share, 2, max_depth=0.67) == ((0, 1), (1, 0))  # layer 2 excluded
    with pytest.raises(ValueError, match="top_k"):
        pick_heads(share, 7)
    with pytest.raises(ValueError, match="max_depth"):
        pick_heads(share, 1, max_depth=0.0)


def test_needle_prompts_mark_the_answer_tokens(tokenizer) -> None:
    builder = PromptBuilder(tokenizer)
    text = "\n".join(f"Line {i} of a plain haystack about nothing in particular." for i in range(300))
    prompts = needle_prompts(builder, [text], n=6, haystack_tokens=400, seed=3)
    assert len(prompts) == 6
    for p in prompts:
        a0, a1 = p.answer
        ctx = p.parts.context_ids
        assert 0 < a0 < a1 < len(ctx) and 400 <= len(ctx) <= 460
        answer = tokenizer.decode(ctx[a0:a1]).strip()
        doc = tokenizer.decode(ctx)
        question = tokenizer.decode(p.parts.query_ids)
        assert answer and answer in doc
        assert any(place in question and place in doc for place in PLACES)
    with pytest.raises(ValueError, match="haystack_tokens"):
        needle_prompts(builder, ["too short"], n=1, haystack_tokens=400, seed=0)



def test_paraphrased_needles_share_only_the_place_with_their_fact(tokenizer) -> None:
    from pipeline.corpus.styles import style_of

    for statement, echoed, other_words in TEMPLATES:
        fact = statement.format(place="Porto", value="X123")
        assert style_of(echoed.format(place="Porto"), [fact], "X123") == "echoed"
        assert style_of(other_words.format(place="Porto"), [fact], "X123") == "paraphrased"
    builder = PromptBuilder(tokenizer)
    text = "\n".join(f"Line {i} of a plain haystack about nothing in particular." for i in range(300))
    plain = needle_prompts(builder, [text], n=6, haystack_tokens=400, seed=3)
    half = needle_prompts(builder, [text], n=6, haystack_tokens=400, seed=3, paraphrased=0.5)
    assert [is_paraphrased(i, 0.5) for i in range(6)] == [False, True, False, True, False, True]
    for i, (a, b) in enumerate(zip(plain, half, strict=True)):
        # Same haystack, fact and answer span; only the question's words change.
        assert a.parts.context_ids == b.parts.context_ids and a.answer == b.answer
        assert (a.parts.query_ids != b.parts.query_ids) == is_paraphrased(i, 0.5)
    with pytest.raises(ValueError, match="paraphrased"):
        needle_prompts(builder, [text], n=1, haystack_tokens=400, seed=0, paraphrased=1.5)
