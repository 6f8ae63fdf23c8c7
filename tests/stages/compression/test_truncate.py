"""Truncation is token-exact and keeps document order."""

from __future__ import annotations

import pytest

from stages.compression.truncate import truncate_ids

IDS = list(range(100))


@pytest.mark.parametrize("keep", ["head", "tail", "head_tail"])
@pytest.mark.parametrize("target", [1, 7, 50, 99, 100, 150])
def test_exact_budget(keep, target):
    out = truncate_ids(IDS, target, keep)
    assert len(out) == min(target, len(IDS))
    assert out == sorted(out)  # document order


def test_which_part_is_kept():
    assert truncate_ids(IDS, 4, "head") == [0, 1, 2, 3]
    assert truncate_ids(IDS, 4, "tail") == [96, 97, 98, 99]
    assert truncate_ids(IDS, 5, "head_tail") == [0, 1, 2, 98, 99]


def test_bad_values():
    with pytest.raises(ValueError, match="keep"):
        truncate_ids(IDS, 4, "middle")
    with pytest.raises(ValueError, match="target_tokens"):
        truncate_ids(IDS, 0, "head")


def test_tokenize_stage_truncates_in_generator_tokens(tokenizer, tmp_path):
    from schemas.loading import spec_from_dict
    from stages.rows import rows_to_batch
    from stages.tokenize import TokenizeStage

    spec = spec_from_dict(
        {"name": "t", "input": {"uri": str(tmp_path)}, "compression": {"method": "truncate", "target_tokens": 10}}
    )
    stage = TokenizeStage(spec.model_dump(mode="json"))
    text = "The quick brown fox jumps over the lazy dog. " * 20
    out = stage(rows_to_batch([{"text": text, "error": None}, {"text": None, "error": "read: bad"}]))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert out["doc_tokens"][0] == len(ids)
    assert list(out["context_ids"][0]) == ids[:5] + ids[-5:]
    assert out["error"][1] == "read: bad" and out["doc_ids"][1] is None


def test_a_cut_moves_inside_the_kept_side_to_a_character_edge_and_a_whole_document_is_one_span():
    """A token that begins inside a character (``edges.inside``) is never a kept run's first
    token nor the first one cut: the head ends before it, the tail starts after it (a
    character's other pieces fewer than the budget; head_tail gives the head's shortfall to
    the tail, and keep head keeps no tail: it kept the document's last token). A document
    within the budget is one span, an empty one none."""
    from stages.compression.truncate import truncate_spans
    from stages.token_bytes import CharacterEdges

    edges = CharacterEdges(frozenset({4, 96}))  # ids 4 and 96 continue the character before them
    assert truncate_spans(IDS, 4, "head", edges) == [0, 3]
    assert truncate_spans(IDS, 4, "tail", edges) == [97, 100]
    assert truncate_spans(IDS, 8, "head_tail", edges) == [0, 3, 95, 100]  # the head's shortfall: the tail's
    assert truncate_spans(IDS, 100, "head_tail") == [0, 100]
    assert truncate_spans([], 5, "head") == []
