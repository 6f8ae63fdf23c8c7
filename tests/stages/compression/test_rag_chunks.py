"""rag's chunks fit the embedder's window (issue 13), checked with the real embedded
all-MiniLM-L6-v2 and its own tokenizer: the auto size never lets the embedder cut a
chunk (a chunk that overflows is halved in place), an explicit size that overflows is
obeyed and counted per row, and the stage reports the retrieval figures."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from schemas.spec import EMBEDDED_EMBEDDER, JobSpec
from stages.compression.chunks import RetrievalResult
from stages.compression.rag import (
    AUTO_WINDOW_FRACTION,
    RagCompression,
    RagStage,
    SentenceEmbedder,
    chunk_document,
    load_embedder,
    rag_contexts,
)
from stages.rows import batch_to_rows, rows_to_batch

PROSE = "The harbour master recorded that the ferry Aurora carries exactly 312 passengers every summer. "
# Whitespace is generator tokens but no word pieces: a document that starts with a
# block of it has a low average ratio, so its prose chunks overflow the first cut.
BLANK = ("\n" + " " * 13 + "\t") * 600
QUESTION = "How many passengers does the ferry Aurora carry?"


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return load_embedder(EMBEDDED_EMBEDDER, "cpu", batch_size=16)


def cut(tokenizer, embedder: SentenceEmbedder, ids: list[int], chunk_tokens: int | None, **kw: Any):
    return chunk_document(
        ids,
        chunk_tokens,
        decode=lambda c: tokenizer.batch_decode(c, skip_special_tokens=True),
        count=embedder.count_tokens,
        max_tokens=kw.pop("max_tokens", embedder.max_tokens),
        **kw,
    )


def test_auto_is_the_default() -> None:
    assert RagCompression().chunk_tokens is None
    with pytest.raises(ValueError, match="chunk_tokens"):
        RagCompression(chunk_tokens=4)


@pytest.mark.parametrize("text", [PROSE * 80, BLANK + PROSE * 60], ids=["prose", "uneven"])
def test_auto_chunks_are_never_cut_by_the_embedder(tokenizer, embedder: SentenceEmbedder, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    chunks, texts, overflow = cut(tokenizer, embedder, ids, None)
    assert overflow == 0
    assert sum(chunks, []) == ids  # consecutive, in document order, nothing lost
    assert texts == tokenizer.batch_decode(chunks, skip_special_tokens=True)
    # What the embedder itself reads: the whole chunk, special tokens included, within its window.
    window = embedder.model.max_seq_length
    assert all(len(embedder.model.tokenizer(t)["input_ids"]) <= window for t in texts)
    # Auto aims at a fraction of the window; overflowing chunks of the uneven text were halved.
    assert max(embedder.count_tokens(texts)) <= embedder.max_tokens
    if text.startswith(BLANK):
        assert len({len(c) for c in chunks[:-1]}) > 1
    else:
        assert max(embedder.count_tokens(texts)) > AUTO_WINDOW_FRACTION * embedder.max_tokens * 0.8


def test_auto_size_follows_the_window(tokenizer, embedder: SentenceEmbedder) -> None:
    ids = tokenizer(PROSE * 40, add_special_tokens=False)["input_ids"]
    small, texts, overflow = cut(tokenizer, embedder, ids, None, max_tokens=40)
    large, _, _ = cut(tokenizer, embedder, ids, None)
    assert overflow == 0 and max(embedder.count_tokens(texts)) <= 40
    assert len(small) > 3 * len(large)
    with pytest.raises(ValueError, match="window"):
        cut(tokenizer, embedder, ids, None, max_tokens=0)


def test_explicit_chunk_tokens_are_obeyed_and_overflow_counted(tokenizer, embedder: SentenceEmbedder) -> None:
    ids = tokenizer(PROSE * 80, add_special_tokens=False)["input_ids"]
    chunks, texts, overflow = cut(tokenizer, embedder, ids, 600)
    assert [len(c) for c in chunks[:-1]] == [600] * (len(chunks) - 1)
    assert overflow == sum(n > embedder.max_tokens for n in embedder.count_tokens(texts)) >= len(chunks) - 1
    (res,) = rag_contexts([ids], [QUESTION], tokenizer=tokenizer, embedder=embedder, target_tokens=700, chunk_tokens=600)
    assert isinstance(res, RetrievalResult) and res.figures()["embedder_truncated_chunks"] == overflow


def job_spec(chunk: int | None) -> dict[str, Any]:
    compression: dict[str, Any] = {"method": "rag", "target_tokens": 256}
    if chunk is not None:
        compression["chunk_tokens"] = chunk
    spec = JobSpec.model_validate(
        {
            "name": "rag-chunks",
            "input": {"uri": "memory://unused", "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa"},
            "compression": compression,
        }
    )
    return spec.model_dump(mode="json")


def rows(tokenizer) -> list[dict[str, Any]]:
    doc = tokenizer(BLANK + PROSE * 60, add_special_tokens=False)["input_ids"]
    short = tokenizer(PROSE, add_special_tokens=False)["input_ids"]
    return [
        {"request_id": "long", "doc_ids": doc, "question": QUESTION, "instruction": "Answer.", "error": None},
        {"request_id": "short", "doc_ids": short, "question": QUESTION, "instruction": "Answer.", "error": None},
        {"request_id": "failed", "doc_ids": None, "question": QUESTION, "instruction": "Answer.", "error": "read: x"},
    ]  # fmt: skip


def test_stage_reports_retrieval_figures(tokenizer, caplog) -> None:
    out = batch_to_rows(RagStage(job_spec(None))(rows_to_batch(rows(tokenizer))))
    long, short, failed = out
    assert long["context_tokens"] == 256 and long["embedder_truncated_chunks"] == 0
    assert long["retrieval_chunks"] > long["retrieved_chunks"] > 0
    assert 0 < long["retrieval_mean_score"] <= long["retrieval_top_score"] <= 1.0
    assert short["retrieval_chunks"] == short["retrieved_chunks"] == 0 and short["retrieval_top_score"] is None
    assert all(failed[c] is None for c in ("retrieval_chunks", "retrieval_top_score", "embedder_truncated_chunks"))
    assert "overflows" not in caplog.text


def test_stage_warns_once_when_explicit_chunks_overflow(tokenizer, caplog) -> None:
    stage = RagStage(job_spec(1000))
    with caplog.at_level(logging.WARNING, logger="stages.compression.rag"):
        out = batch_to_rows(stage(rows_to_batch(rows(tokenizer))))
        stage(rows_to_batch(rows(tokenizer)))
    assert out[0]["embedder_truncated_chunks"] >= 1
    assert caplog.text.count("chunk_tokens 1000 overflows the embedder's window of 254") == 1
