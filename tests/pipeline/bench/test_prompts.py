"""Benchmark prompts: summary and question requests cut to an exact token count."""

from __future__ import annotations

import json

import pytest

from pipeline.bench.prompts import read_corpus_texts, summary_prompts


def test_prompts_have_exactly_the_asked_length(tokenizer):
    prompts = summary_prompts(tokenizer, "jobs/corpus", rows=3, prompt_tokens=300)
    assert [len(p) for p in prompts] == [300, 300, 300]
    assert len({tuple(p) for p in prompts}) == 3  # one document each
    text = tokenizer.decode(prompts[0])
    assert "Write a short summary of the document above" in text


def test_short_documents_are_continued_and_rows_cycle(tokenizer, tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta gamma. " * 5)
    (tmp_path / "b.txt").write_text("delta epsilon. " * 5)
    prompts = summary_prompts(tokenizer, str(tmp_path), rows=5, prompt_tokens=400)
    assert {len(p) for p in prompts} == {400}
    assert prompts[0] == prompts[2] == prompts[4] and prompts[1] == prompts[3]
    assert "delta" in tokenizer.decode(prompts[0])  # a.txt continued with b.txt


def test_jsonl_corpus_and_bad_input(tokenizer, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"id": "x", "text": "some text here"}) + "\n")
    assert read_corpus_texts(str(path)) == ["some text here"]
    with pytest.raises(ValueError, match="--corpus"):
        read_corpus_texts(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="--prompt-tokens 10"):
        summary_prompts(tokenizer, str(path), rows=1, prompt_tokens=10)


def test_qa_prompts_have_the_exact_length_and_a_question_whose_answer_survived(tokenizer, tmp_path):
    from pipeline.bench.prompts import qa_prompts

    text = "Filler sentence about nothing. " * 60 + "The secret colour is teal. " + "More filler text here. " * 60
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": "d", "text": text, "questions": ["Which animal?", "What is the secret colour?"],
                                "answers": ["a cat", "teal"]}) + "\n")
    [prompt] = qa_prompts(tokenizer, str(path), 1, 700)
    assert len(prompt) == 700
    decoded = tokenizer.decode(prompt)
    assert "What is the secret colour?" in decoded and "teal" in decoded
    with pytest.raises(ValueError, match="needs a JSONL file"):
        qa_prompts(tokenizer, str(tmp_path), 1, 700)
