"""Head sets: fingerprints, the user cache, the shipped files."""

from __future__ import annotations

import json

import pytest
import torch
from finch_testlib import tiny

from stages.finch.heads import (
    SHIPPED_DIR,
    HeadSet,
    check_heads,
    find_heads,
    lookup,
    model_fingerprint,
    save_heads,
)


def test_fingerprint_same_weights_any_dtype_other_weights_differ() -> None:
    a = tiny("llama", seed=0, dtype=torch.float32)
    assert model_fingerprint(a) == model_fingerprint(tiny("llama", seed=0, dtype=torch.float32))
    assert model_fingerprint(a) == model_fingerprint(tiny("llama", seed=0, dtype=torch.bfloat16))
    assert model_fingerprint(a) != model_fingerprint(tiny("llama", seed=1, dtype=torch.float32))
    assert model_fingerprint(a) != model_fingerprint(tiny("llama", seed=0, dtype=torch.float32,
                                                          rope_theta=20000.0))


def test_saved_heads_are_found_by_fingerprint(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    model = tiny("llama", seed=3, dtype=torch.float32)
    assert find_heads(model) is None
    other = tiny("llama", seed=4, dtype=torch.float32)
    hs = HeadSet("tiny", model_fingerprint(other), ((1, 2), (0, 3)), {"note": "x"})
    path = save_heads(hs)
    assert path == tmp_path / "finch_heads" / f"{hs.fingerprint}.json"
    fresh = tiny("llama", seed=4, dtype=torch.float32)  # same weights, new object
    found = find_heads(fresh)
    assert found == hs and max(found.by_layer()) == 1 and found.by_layer() == {0: [3], 1: [2]}
    assert find_heads(tiny("llama", seed=5, dtype=torch.float32)) is None


def test_shipped_directory_wins_and_bad_files_are_skipped(tmp_path) -> None:
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    hs = HeadSet("m", "abcd", ((0, 1),))
    save_heads(hs, shipped / "m.json")
    (shipped / "broken.json").write_text("{not json")
    assert lookup("abcd", shipped) == hs
    assert lookup("ffff", shipped) is None


def test_heads_outside_the_model_raise() -> None:
    model = tiny("llama", dtype=torch.float32)  # 2 layers x 4 heads
    with pytest.raises(ValueError, match="outside"):
        check_heads(model, HeadSet("m", "f", ((2, 0),)))
    with pytest.raises(ValueError, match="at least one"):
        HeadSet.from_json({"model": "m", "fingerprint": "f", "heads": []})


def test_shipped_files_are_valid_and_packaged() -> None:
    files = sorted(SHIPPED_DIR.glob("*.json"))
    assert files, "the embedded model's head set ships with the package"
    for f in files:
        hs = HeadSet.from_json(json.loads(f.read_text()))
        assert len(hs.fingerprint) == 16 and hs.heads


@pytest.mark.e2e
def test_embedded_model_finds_its_shipped_heads(embedded_model) -> None:
    model, _ = embedded_model
    hs = find_heads(model)
    assert hs is not None and hs.model == "embedded:smollm2-135m-instruct"
    assert (SHIPPED_DIR / "smollm2-135m-instruct.json").is_file()
    assert max(hs.by_layer()) < 24  # early exit skips the top layers
