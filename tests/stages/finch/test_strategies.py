"""stages/finch/strategies.py: which selector ``make_selector`` builds for each setting,
the layers it captures and runs, and what each one keeps of a pass whose attention is
planted (the prompt's queries point at chosen slots, so every scoring agrees on them)."""

from __future__ import annotations

import pytest
import torch
from finch_testlib import heads_config, tiny

from stages.finch.compaction import make_plan
from stages.finch.heads import HeadSet
from stages.finch.strategies import (
    HeadSelector,
    PaperSelector,
    PassView,
    PerLayerSelector,
    make_selector,
)

LP, C, P, D = 2, 14, 2, 16  # prefix width, candidates (the last P are the prompt's own), head dim
S = LP + C


@pytest.fixture(scope="module")
def model():
    return tiny("llama", seed=0)  # 2 layers, 4 query heads, 2 KV heads


def _heads(*pairs: tuple[int, int]) -> HeadSet:
    return HeadSet(model="tiny", fingerprint="0" * 16, heads=tuple(pairs))


@pytest.mark.parametrize(
    ("settings", "heads", "kind", "capture", "run", "groups"),
    [
        ({"scoring": "paper", "mode": "kv"}, None, PaperSelector, [0, 1], 2, 1),
        ({"scoring": "paper", "head_mode": "kv_group", "mode": "kv"}, None, PaperSelector, [0, 1], 2, 2),
        ({"selection": "per_layer", "mode": "kv"}, None, PerLayerSelector, [0, 1], 2, 1),
        ({"selection": "per_layer", "head_mode": "kv_group", "mode": "kv"}, None, PerLayerSelector, [0, 1], 2, 2),
        ({}, None, HeadSelector, [0, 1], 2, 1),  # uncalibrated: every head of every layer
        ({}, ((0, 3), (0, 1)), HeadSelector, [0], 1, 1),  # early exit after layer 0
        ({"head_mode": "kv_group", "mode": "kv"}, ((1, 2),), HeadSelector, [1], 2, 2),
    ],
)
def test_make_selector_picks_the_strategy_and_its_layers(model, settings, heads, kind, capture, run, groups):
    sel = make_selector(model, heads_config(**settings), _heads(*heads) if heads else None)
    assert type(sel) is kind
    assert sel.capture_layers == capture and sel.run_layers == run and sel.groups == groups
    assert sel.scaling == [D**-0.5, D**-0.5]


def test_head_selector_groups_its_heads_by_layer_and_kv_head(model):
    cfg = heads_config(head_mode="kv_group", mode="kv")
    sel = make_selector(model, cfg, _heads((1, 3), (0, 1), (1, 2), (0, 1)))
    assert sel.by_layer == {0: [1], 1: [2, 3]}  # sorted, duplicates dropped
    assert sel.has_head.tolist() == [True, True]  # query head 1 -> KV head 0; 2, 3 -> KV head 1
    assert make_selector(model, cfg, _heads((1, 0))).has_head.tolist() == [True, False]


def _planted_view(per_layer_targets: list[list[list[int]]], seed: int = 0) -> PassView:
    """A one-row pass where, in layer l, KV head k's keys at candidates
    ``per_layer_targets[l][k]`` match every prompt query; other keys are small noise.
    Candidate 0 is planted too but is not a candidate (invalid); the last P are the prompt's."""
    g = torch.Generator().manual_seed(seed)
    u = torch.zeros(D, dtype=torch.float64)
    u[0] = 6.0
    keys, queries = [], {}
    for layer, targets in enumerate(per_layer_targets):
        k = torch.randn(1, 2, S, D, generator=g, dtype=torch.float64) * 0.05
        for kv, slots in enumerate(targets):
            for c in [0, *slots]:
                k[0, kv, LP + c] = u
        keys.append(k)
        queries[layer] = u.expand(1, 4, P, D).clone()
    valid = torch.ones(1, C, dtype=torch.bool)
    valid[0, 0] = False
    valid[0, C - P :] = False
    return PassView(queries=queries, keys=keys, row_mask=torch.ones(1, P, S, dtype=torch.bool),
                    p_real=torch.ones(1, P, dtype=torch.bool), lp=LP, cand_valid=valid)


def _plan(kept: int):
    return make_plan(torch.tensor([kept]), torch.tensor([LP]))


def test_paper_and_per_layer_keep_each_layers_own_choice_heads_share_the_selecting_layers(model):
    view = _planted_view([[[3, 6, 9]] * 2, [[4, 7, 10]] * 2])  # layer 0 and layer 1 disagree
    paper = make_selector(model, heads_config(scoring="paper", mode="kv"), None).select(view, _plan(3))
    per_layer = make_selector(model, heads_config(selection="per_layer", mode="kv", pool_window=1),
                              None).select(view, _plan(3))
    assert [i.tolist() for i in paper] == [[[[3, 6, 9]]], [[[4, 7, 10]]]]
    assert [i.tolist() for i in per_layer] == [[[[3, 6, 9]]], [[[4, 7, 10]]]]
    # Heads only in layer 1: one selection, layer 1's, for every layer of the pass.
    shared = make_selector(model, heads_config(mode="kv", pool_window=1), _heads((1, 0), (1, 3)))
    got = shared.select(view, _plan(3))
    assert len(got) == 2 and got[0] is got[1]
    assert got[0].tolist() == [[[4, 7, 10]]]


def test_kv_groups_select_apart_and_a_group_without_heads_follows_the_others(model):
    view = _planted_view([[[2, 3, 4], [8, 9, 10]]] * 2)  # KV head 0 and KV head 1 look apart
    for settings in ({"scoring": "paper"}, {"selection": "per_layer", "pool_window": 1}):
        cfg = heads_config(head_mode="kv_group", mode="kv", **settings)
        got = make_selector(model, cfg, None).select(view, _plan(3))
        assert [i.tolist() for i in got] == [[[[2, 3, 4], [8, 9, 10]]]] * 2, settings
    cfg = heads_config(head_mode="kv_group", mode="kv", pool_window=1)
    only_group_0 = make_selector(model, cfg, _heads((0, 0), (0, 1))).select(view, _plan(3))
    assert only_group_0[0].tolist() == [[[2, 3, 4], [2, 3, 4]]]


def test_pooled_heads_keep_a_run_around_a_strong_token_the_paper_keeps_tokens(model):
    view = _planted_view([[[7]] * 2] * 2)
    pooled = make_selector(model, heads_config(mode="kv", pool_window=3), None).select(view, _plan(3))
    assert pooled[0].tolist() == [[[6, 7, 8]]]  # the peak and its window
    per_layer = make_selector(model, heads_config(selection="per_layer", mode="kv", pool_window=3),
                              None).select(view, _plan(3))
    assert [i.tolist() for i in per_layer] == [[[[6, 7, 8]]]] * 2  # each layer pools its own heads too
    paper = make_selector(model, heads_config(scoring="paper", mode="kv"), None).select(view, _plan(3))
    assert 7 in paper[0][0, 0].tolist() and paper[0][0, 0].tolist() != [6, 7, 8]
