"""Evidence recall (pipeline/eval/recall.py) with the embedded model's real tokenizer, and
the kept spans the text methods report (what recall reads)."""

from __future__ import annotations

import json

import pytest

from pipeline.eval.recall import (
    Evidence,
    evidence_for,
    evidence_of,
    kept_count,
    recall_figures,
    token_range,
)
from stages.compression.base import positions_of, spans_of
from stages.compression.bm25 import Bm25Compression, bm25_result
from stages.compression.chunks import kept_spans, split_chunks
from stages.compression.truncate import truncate_ids, truncate_spans

TEXT = (
    "The committee met in the old library. Members read reports about roads.\n\n"
    "The vault code of the Zurich branch is 4417. Nobody wrote it down!\n\n"
    "The ferry Aurora carries 312 passengers."
)


def _offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [tuple(o) for o in enc["offset_mapping"]]


def test_evidence_is_the_answer_sentence_in_the_generators_tokens(tokenizer) -> None:
    offsets = _offsets(tokenizer, TEXT)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ev = evidence_of(TEXT, "4417", offsets)
    assert ev is not None and ev.doc_tokens == len(ids)
    s0, s1 = ev.sentence
    assert tokenizer.decode(ids[s0:s1]).strip() == "The vault code of the Zurich branch is 4417."
    a0, a1 = ev.answer
    assert s0 <= a0 < a1 <= s1 and "4417" in tokenizer.decode(ids[a0:a1])
    last = evidence_of(TEXT, "312", offsets)
    assert last is not None and tokenizer.decode(ids[slice(*last.sentence)]).strip() == "The ferry Aurora carries 312 passengers."
    assert evidence_of(TEXT, "not in it", offsets) is None
    with pytest.raises(ValueError, match="no token covers"):
        token_range(offsets, len(TEXT) + 5, len(TEXT) + 9)


def test_evidence_for_reads_an_eval_set(tmp_path, tokenizer) -> None:
    rec = {"id": "d", "text": TEXT, "questions": ["Vault code?", "Missing?"], "answers": ["4417", "zebra"]}
    p = tmp_path / "set.jsonl"
    p.write_text(json.dumps(rec) + "\n\n")
    index = evidence_for(str(p), tokenizer)
    assert set(index) == {("d", "Vault code?")}  # an answer not in the text has no evidence
    assert index[("d", "Vault code?")] == evidence_of(TEXT, "4417", _offsets(tokenizer, TEXT))


def test_recall_figures_need_the_whole_sentence() -> None:
    ev = Evidence(sentence=(10, 20), answer=(17, 19), doc_tokens=100)
    assert recall_figures([0, 100], ev, 100) == {"evidence_recall": 1.0, "answer_recall": 1.0, "evidence_share": 1.0}
    # the sentence cut at a chunk boundary: the answer survives, the sentence does not
    assert recall_figures([0, 12, 15, 30], ev, 100) == {
        "evidence_recall": 0.0, "answer_recall": 1.0, "evidence_share": 0.7}  # fmt: skip
    # scattered KV positions (a KV method): a share of the sentence, not the answer's last token
    assert recall_figures([11, 12, 17, 18, 50, 60], ev, 100) == {
        "evidence_recall": 0.0, "answer_recall": 0.0, "evidence_share": 0.2}  # fmt: skip
    assert recall_figures([], ev, 100)["evidence_share"] == 0.0
    none = dict.fromkeys(("evidence_recall", "answer_recall", "evidence_share"))
    assert recall_figures(None, ev, 100) == none  # summary vectors: no positions
    assert recall_figures([0, 100], None, 100) == none  # a question without evidence
    assert recall_figures([0, 100], ev, 99) == none  # tokenised differently from the pipeline
    assert kept_count([0, 5, 8, 12], 3, 10) == 4


def test_spans_round_trip() -> None:
    assert spans_of([3, 4, 5, 9]) == [3, 6, 9, 10] and spans_of([]) == []
    assert positions_of([3, 6, 9, 10]) == [3, 4, 5, 9]
    with pytest.raises(ValueError, match="strictly ascending"):
        spans_of([4, 3])


@pytest.mark.parametrize("keep", ["head", "tail", "head_tail"])
@pytest.mark.parametrize(("n", "target"), [(10, 4), (10, 5), (3, 8), (10, 1)])
def test_truncate_spans_locate_its_ids(keep: str, n: int, target: int) -> None:
    doc = [100 + i for i in range(n)]
    spans = truncate_spans(doc, target, keep)
    assert [doc[p] for p in positions_of(spans)] == truncate_ids(doc, target, keep)


def test_retrieval_spans_locate_the_kept_chunks() -> None:
    chunks = split_chunks(list(range(12)), 3)
    assert kept_spans(chunks, [(0, 3), (1, 3), (3, 2)]) == [0, 6, 9, 11]  # adjacent chunks merge
    doc = [1, 2, 3, 4, 5, 6, 7, 8] * 2 + [9, 9, 9, 9, 1, 2, 3, 4] + [5, 6, 7, 8] * 6
    res = bm25_result(doc, [9], Bm25Compression(target_tokens=12, chunk_tokens=8))
    assert res.spans == [0, 4, 16, 24]  # the 9s' chunk and the head of a tied one, document order
    assert [doc[p] for p in positions_of(res.spans)] == res.context_ids
    whole = bm25_result(doc, [9], Bm25Compression(target_tokens=500, chunk_tokens=8))
    assert whole.spans == [0, len(doc)]


def test_a_repeated_answer_takes_the_occurrence_its_depth_points_to(tokenizer) -> None:
    """'dizziness' in a trial's background and again in its results: the evidence is where
    the record's depth points, not the first mention."""
    text = ("Background: dizziness was a concern in earlier drugs. Methods were standard.\n\n"
            "Results: the most frequent adverse event was dizziness, in 12 percent.")
    offsets, ids = _offsets(tokenizer, text), tokenizer(text, add_special_tokens=False)["input_ids"]
    second = text.rindex("dizziness")
    late = evidence_of(text, "dizziness", offsets, depth=second / len(text))
    assert late is not None and tokenizer.decode(ids[slice(*late.sentence)]).strip().startswith("Results:")
    early = evidence_of(text, "dizziness", offsets)  # no depth: the first occurrence
    assert early is not None and tokenizer.decode(ids[slice(*early.sentence)]).strip().startswith("Background:")
