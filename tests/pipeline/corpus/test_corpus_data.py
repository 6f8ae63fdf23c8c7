"""Checks on the committed sample data in jobs/: corpus, sample QA and the eval parts.

The eval parts and sample QA are regenerated from the committed corpus with the real
builder and must match the committed files, so hand edits or a stale rebuild fail
here. Rebuilding the corpus itself needs Debian's python3.11-doc; that check runs only
where the package is installed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.corpus.build import (
    DOC_ROOT,
    EVAL_TOKENS,
    SAMPLE_TOKENS,
    SOURCES,
    TOKEN_RANGE,
    sample_qa_records,
)
from pipeline.corpus.eval_records import MAX_DEPTH_ERROR, PARTS, TARGET_DEPTHS, build_part
from pipeline.corpus.qa import FACTS, NEEDLES
from pipeline.corpus.styles import STYLES

JOBS = Path(__file__).resolve().parents[3] / "jobs"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def corpus() -> dict[str, str]:
    return {p.stem: p.read_text("utf-8") for p in sorted((JOBS / "corpus").iterdir())}


@pytest.fixture(scope="module")
def sample() -> list[dict]:
    return _jsonl(JOBS / "sample-qa.jsonl")


@pytest.fixture(scope="module")
def parts() -> dict[str, list[dict]]:
    return {name: _jsonl(JOBS / "eval" / part.file) for name, part in PARTS.items()}


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def test_corpus_files_counts_and_size(corpus):
    files = list((JOBS / "corpus").iterdir())
    assert all(p.suffix == ".txt" for p in files), "only documents may live in jobs/corpus"
    assert set(corpus) == set(SOURCES)
    assert 30 <= len(corpus) <= 40
    assert sum(p.stat().st_size for p in files) < 3_000_000


def test_corpus_token_lengths(corpus, tokenizer):
    sizes = {d: _tokens(tokenizer, t) for d, t in corpus.items()}
    bad = {d: n for d, n in sizes.items() if not TOKEN_RANGE[0] <= n <= TOKEN_RANGE[1]}
    assert not bad, f"documents outside {TOKEN_RANGE} tokens: {bad}"


def test_corpus_is_clean_text(corpus):
    markup = (":func:`", ":meth:`", ":ref:`", "``", ".. index::", ".. note::", ".. code-block::")
    for doc_id, text in corpus.items():
        assert not [m for m in markup if m in text], f"reST markup left in {doc_id}"
        assert text.endswith("\n") and "\n\n\n" not in text, doc_id
        assert not any(line != line.rstrip() for line in text.splitlines()), doc_id


def test_sample_qa(sample, corpus, tokenizer):
    assert 6 <= len(sample) <= 10
    for rec in sample:
        assert set(rec) == {"id", "text", "questions", "answers"}
        assert rec["text"] == corpus[rec["id"]]
        assert 2 <= len(rec["questions"]) == len(rec["answers"]) <= 3
        for answer in rec["answers"]:
            assert answer and answer in rec["text"], (rec["id"], answer)
        assert SAMPLE_TOKENS[0] <= _tokens(tokenizer, rec["text"]) <= SAMPLE_TOKENS[1]


def test_eval_parts_shape_and_lengths(parts, tokenizer):
    assert list(parts) == ["tuning", "report", "heldout-paraphrased"]
    docs = [r["id"] for recs in parts.values() for r in recs]
    assert len(docs) == len(set(docs)) == 24, "each part has its own documents"
    for name, recs in parts.items():
        assert len(recs) == 8
        for rec in recs:
            assert set(rec) == {"id", "text", "questions", "answers", "depths", "kind", "style"}
            n = len(rec["questions"])
            assert len(rec["answers"]) == len(rec["depths"]) == len(rec["kind"]) == len(rec["style"]) == n
            assert set(rec["style"]) <= set(STYLES)
            assert EVAL_TOKENS[0] <= _tokens(tokenizer, rec["text"]) <= EVAL_TOKENS[1], (name, rec["id"])
    for name in ("tuning", "report"):  # the same mix of questions in both
        styles = [(k, s) for r in parts[name] for k, s in zip(r["kind"], r["style"], strict=True)]
        assert len(styles) == 80
        assert styles.count(("inserted", "echoed")) == styles.count(("inserted", "paraphrased")) == 24
        assert styles.count(("inserted", "two_sentence")) == 16 and sum(k == "native" for k, _ in styles) == 16
    held = [s for r in parts["heldout-paraphrased"] for s in r["style"]]
    assert held == ["paraphrased"] * 24


def test_held_out_facts_are_new():
    """The held-out set's facts share no answer, question or sentence with the tuning part's."""
    tuning = {x for f in [*FACTS["tuning"]["paraphrased"], *FACTS["tuning"]["two_sentence"]]
              for x in (f[1], f[2], *f[0])} | {x for n in NEEDLES for x in n}
    held = {x for f in FACTS["heldout"]["paraphrased"] for x in (f[1], f[2], *f[0])}
    assert not tuning & held


def test_eval_answers_sit_at_stated_depth(parts):
    for rec in (r for recs in parts.values() for r in recs):
        text = rec["text"]
        for answer, depth in zip(rec["answers"], rec["depths"], strict=True):
            starts = [m.start() for m in re.finditer(re.escape(answer), text)]
            assert starts, (rec["id"], answer)
            assert min(abs(i / len(text) - depth) for i in starts) < 0.001, (rec["id"], answer)


def test_eval_inserted_facts(parts, corpus):
    paragraphs = {answer: sentence for sentence, _, answer in NEEDLES}
    paragraphs |= {a: " ".join(sents) for styles in FACTS.values() for facts in styles.values()
                   for sents, _, a in facts}
    reached = set()
    for name, recs in parts.items():
        for rec in recs:
            original, text = corpus[rec["id"]], rec["text"]
            for answer, depth, kind in zip(rec["answers"], rec["depths"], rec["kind"], strict=True):
                if kind == "native":
                    assert answer in original, (rec["id"], answer)
                    continue
                assert answer not in original and text.count(answer) == 1, (rec["id"], answer)
                text = text.replace(paragraphs[answer] + "\n\n", "", 1)
                reached |= {t for t in TARGET_DEPTHS if abs(depth - t) <= MAX_DEPTH_ERROR}
            # The facts are whole paragraphs: taking them out restores the document (its
            # head, for a part that cuts its documents).
            if PARTS[name].max_chars is None:
                assert text == original, rec["id"]
            else:
                assert original.startswith(text[:-1]) and len(text) <= PARTS[name].max_chars + 1, rec["id"]
    assert reached == set(TARGET_DEPTHS), "inserted facts must cover every target depth"


def test_committed_qa_files_match_the_builder(corpus, sample, parts):
    assert sample_qa_records(corpus) == sample
    for name, part in PARTS.items():
        assert build_part(corpus, part) == parts[name], name


def test_readme_lists_every_document_and_the_licence(corpus):
    readme = (JOBS / "README.md").read_text("utf-8")
    assert "PSF License Agreement" in readme
    missing = [d for d in corpus if f"`{d}`" not in readme]
    assert not missing, f"jobs/README.md does not list {missing}"


@pytest.mark.skipif(not DOC_ROOT.is_dir(), reason="needs Debian's python3.11-doc sources")
def test_corpus_rebuilds_from_debian_docs(corpus):
    from pipeline.corpus.build import build_corpus

    assert build_corpus() == corpus


def test_build_from_the_committed_corpus_writes_the_committed_files(tmp_path):
    """`python -m pipeline.corpus.build --from-corpus`: no reST sources, same QA files."""
    import shutil

    from pipeline.corpus.build import main

    shutil.copytree(JOBS / "corpus", tmp_path / "corpus")
    main(["--out", str(tmp_path), "--from-corpus"])
    assert (tmp_path / "sample-qa.jsonl").read_bytes() == (JOBS / "sample-qa.jsonl").read_bytes()
    for part in PARTS.values():
        assert (tmp_path / "eval" / part.file).read_bytes() == (JOBS / "eval" / part.file).read_bytes()
    (tmp_path / "corpus" / "faq-general.txt").unlink()
    with pytest.raises(ValueError, match="lacks"):
        main(["--out", str(tmp_path), "--from-corpus"])
