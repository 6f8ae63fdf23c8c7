"""stages/autocompressor/data.py: training files found and read (errors name the path or
the line), documents joined with EOS and cut into fixed blocks, batches that see every
block once per epoch."""

from __future__ import annotations

import json

import pytest
import torch

from stages.autocompressor.data import batches, find_text_files, read_training_texts, token_blocks


def test_find_text_files_searches_folders_sorted_and_keeps_given_files(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("b/z.md", "b/a.txt", "c.jsonl", "skip.py", "b/skip.json"):
        (tmp_path / name).write_text("x")
    extra = tmp_path / "extra.text"
    extra.write_text("x")
    found = find_text_files([tmp_path, extra])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["b/a.txt", "b/z.md", "c.jsonl", "extra.text"]


def test_find_text_files_refuses_missing_paths_and_empty_folders(tmp_path):
    with pytest.raises(ValueError, match="training data path '.*nope' does not exist"):
        find_text_files([tmp_path / "nope"])
    (tmp_path / "code.py").write_text("x")
    with pytest.raises(ValueError, match=r"no \.txt/\.md/\.jsonl files under"):
        find_text_files([tmp_path])


def test_read_training_texts_one_per_file_or_jsonl_line(tmp_path):
    (tmp_path / "a.txt").write_text("first text")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "second"}) + "\n\n" + json.dumps({"body": 3}) + "\n")
    files = [tmp_path / "a.txt", tmp_path / "b.jsonl"]
    assert list(read_training_texts(files, text_field="body")) == ["first text", "second", "3"]
    with pytest.raises(ValueError, match=r"b\.jsonl:1: no 'text' field in the JSON object"):
        list(read_training_texts(files))


def test_token_blocks_join_documents_with_eos_and_drop_the_tail(tokenizer):
    docs = ["The river flows north.", "", "It reaches the sea at Hamburg."]
    first = tokenizer(docs[0], add_special_tokens=False)["input_ids"]
    second = tokenizer(docs[2], add_special_tokens=False)["input_ids"]
    stream = first + [tokenizer.eos_token_id] + second + [tokenizer.eos_token_id]  # empty text adds nothing
    blocks = token_blocks(iter(docs), tokenizer, 4)
    n = len(stream) // 4
    assert blocks.shape == (n, 4) and blocks.dtype == torch.long
    assert blocks.flatten().tolist() == stream[: n * 4]
    with pytest.raises(ValueError, match=f"has {len(stream)} tokens, fewer than one block of 1000"):
        token_blocks(iter(docs), tokenizer, 1000)
    with pytest.raises(ValueError, match="block_tokens must be >= 2, got 1"):
        token_blocks(iter(docs), tokenizer, 1)


def test_batches_see_every_block_once_per_epoch_reproducibly():
    blocks = torch.arange(10)[:, None].expand(10, 3)  # block i holds i
    it = batches(blocks, 4, seed=7)
    seen = [next(it)[:, 0].tolist() for _ in range(5)]  # 20 blocks: two epochs
    assert all(len(b) == 4 for b in seen)
    flat = sum(seen, [])
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]  # reshuffled every epoch
    again = batches(blocks, 4, seed=7)
    assert [next(again)[:, 0].tolist() for _ in range(5)] == seen
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        next(batches(blocks, 0))
