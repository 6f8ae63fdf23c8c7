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
