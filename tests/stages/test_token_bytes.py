"""Tokens' bytes and the edges between characters (stages/token_bytes.py), with the
embedded byte-level tokenizer: a CJK character or an accented letter split across tokens
is read from the vocabulary, and no cut the edges allow splits one."""

from __future__ import annotations

from stages.token_bytes import NO_EDGES, CharacterEdges, token_bytes


def test_token_bytes_read_parts_of_characters_from_the_vocabulary(tokenizer):
    tb = token_bytes(tokenizer)
    for text in ("总部位于上海！", "naïve café ✓", "Schäfer"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert b"".join(tb[i] for i in ids) == text.encode("utf-8")


def test_edges_move_a_cut_out_of_a_character(tokenizer):
    edges = CharacterEdges.of(tokenizer)
    text = "总部位于上海！naïve ✓"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    inside = [i for i in range(len(ids)) if not edges.clean(ids, i)]
    assert inside  # the tokenizer does split characters here: the test can fail
    for i in range(len(ids) + 1):
        back, ahead = edges.before(ids, i), edges.after(ids, i)
        assert back <= i <= ahead and edges.clean(ids, back) and edges.clean(ids, ahead)
        assert "\ufffd" not in tokenizer.decode(ids[:back]) + tokenizer.decode(ids[ahead:])
    assert all(NO_EDGES.clean(ids, i) for i in range(len(ids)))


def test_edges_stop_at_their_bounds():
    edges = CharacterEdges(frozenset({9}))
    ids = [1, 9, 9, 2]
    assert edges.before(ids, 2) == 0 and edges.before(ids, 2, lo=1) == 1
    assert edges.after(ids, 1) == 3 and edges.after(ids, 1, hi=2) == 2
