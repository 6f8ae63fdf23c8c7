"""Method rag. Core: exact budget, document order, retrieval with the real embedded
MiniLM, batching across documents, per-request failure isolation. Stage: the
numpy-batch contract (error rows pass through, a bad row fails alone, nothing
dropped) and a run inside real Ray Data with an actor pool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from schemas.spec import EMBEDDED_EMBEDDER, JobSpec
from stages.compression.chunks import RetrievalResult
from stages.compression.rag import (
    RagStage,
    SentenceEmbedder,
    load_embedder,
    rag_contexts,
)
from stages.rows import batch_to_rows, rows_to_batch

CHUNK = 32

# One topic per paragraph; each is cut/padded to exactly CHUNK tokens so chunk c of
# the document is paragraph c.
PARAGRAPHS = [
    "The recipe for sourdough bread starts with flour, water and a starter that ferments overnight. "
    "Bakers fold the dough several times and bake it in a hot cast iron pot.",
    "Jupiter is the largest planet of the solar system. Its great red spot is a storm larger than "
    "the Earth, and its moons Io and Europa are studied by space probes.",
    "The football match ended two to one after a late penalty. The striker scored twice and the "
    "goalkeeper saved a free kick in the final minute of the game.",
    "The secret code to open the bank vault of Zurich is 4417. Only the night manager of the bank "
    "knows the vault code and changes it every month.",
    "Tomatoes grow best in warm soil with plenty of sun. Gardeners water the plants in the morning "
    "and tie the stems to wooden stakes as they grow taller.",
    "The violin concerto was first performed in Vienna. The orchestra rehearsed for weeks and the "
    "soloist played the difficult cadenza from memory.",
]
VAULT = 3


class CountingEmbedder:
    """Wraps the real embedder, recording every call (and optionally failing on a text)."""

    def __init__(self, inner: SentenceEmbedder, poison: str | None = None) -> None:
        self.inner = inner
        self.poison = poison
        self.calls: list[tuple[str, int]] = []
        self.max_tokens = inner.max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def _check(self, texts: list[str]) -> None:
        if self.poison is not None and any(self.poison in t for t in texts):
            raise RuntimeError("poisoned text")

    def embed_queries(self, texts: list[str]) -> torch.Tensor:
        self.calls.append(("q", len(texts)))
        self._check(texts)
        return self.inner.embed_queries(texts)

    def embed_chunks(self, texts: list[str]) -> torch.Tensor:
        self.calls.append(("c", len(texts)))
        self._check(texts)
        return self.inner.embed_chunks(texts)


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return load_embedder(EMBEDDED_EMBEDDER, "cpu", batch_size=16)


def paragraph_doc(tokenizer, order: list[int]) -> list[int]:
    ids: list[int] = []
    for p in order:
        toks = tokenizer(PARAGRAPHS[p] + " " + PARAGRAPHS[p], add_special_tokens=False)["input_ids"]
        ids.extend(toks[:CHUNK])
    return ids


def is_subsequence(small: list[int], big: list[int]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def test_answer_chunk_is_retrieved(tokenizer, embedder) -> None:
    doc = paragraph_doc(tokenizer, list(range(len(PARAGRAPHS))))
    (res,) = rag_contexts(
        [doc],
        ["What is the secret code of the bank vault?"],
        tokenizer=tokenizer,
        embedder=embedder,
        target_tokens=40,
        chunk_tokens=CHUNK,
    )
    assert isinstance(res, RetrievalResult)
    assert len(res.context_ids) == 40
    assert (VAULT, CHUNK) in res.kept  # the best chunk is kept whole
    assert "4417" in tokenizer.decode(res.context_ids)
    assert is_subsequence(res.context_ids, doc)
    assert res.compress_s > 0 and res.n_chunks == len(PARAGRAPHS)
    figures = res.figures()
    assert figures["retrieval_chunks"] == len(PARAGRAPHS) and figures["retrieved_chunks"] == len(res.kept) == 2
    assert figures["retrieval_top_score"] >= figures["retrieval_mean_score"] > 0
    assert figures["embedder_truncated_chunks"] == 0  # 32-token chunks fit MiniLM's window


def test_short_document_kept_whole_without_embedding(tokenizer, embedder) -> None:
    counting = CountingEmbedder(embedder)
    doc = paragraph_doc(tokenizer, [0, 1])
    (res,) = rag_contexts(
        [doc],
        ["anything"],
        tokenizer=tokenizer,
        embedder=counting,
        target_tokens=len(doc),
        chunk_tokens=CHUNK,
    )
    assert isinstance(res, RetrievalResult) and res.context_ids == doc
    assert counting.calls == []
    assert res.figures() == {
        "retrieval_chunks": 0, "retrieved_chunks": 0, "retrieval_top_score": None,
        "retrieval_mean_score": None, "embedder_truncated_chunks": 0,
    }  # fmt: skip


def test_batch_equals_per_row_with_one_encode_call(tokenizer, embedder) -> None:
    docs = [
        paragraph_doc(tokenizer, [0, 1, 2, 3, 4, 5]),
        paragraph_doc(tokenizer, [5, 3, 1]),
        paragraph_doc(tokenizer, [2]),  # fits the budget
        paragraph_doc(tokenizer, [4, 0, 2, 1]),
    ]
    queries = [
        "Which planet has a great red spot?",
        "Who knows the vault code?",
        "What was the score?",
        "How do you bake sourdough bread?",
    ]
    kw = dict(tokenizer=tokenizer, target_tokens=50, chunk_tokens=CHUNK)
    counting = CountingEmbedder(embedder)
    batched = rag_contexts(docs, queries, embedder=counting, **kw)
    # one query call and one chunk call over the 6 + 3 + 4 chunks of the long docs
    assert counting.calls == [("q", 3), ("c", 13)]
    for d, q, b in zip(docs, queries, batched, strict=True):
        (single,) = rag_contexts([d], [q], embedder=embedder, **kw)
        assert isinstance(b, RetrievalResult) and isinstance(single, RetrievalResult)
        assert b.context_ids == single.context_ids
        assert len(b.context_ids) == min(50, len(d))
    assert "red spot" in tokenizer.decode(batched[0].context_ids)


def test_bad_request_fails_alone(tokenizer, embedder) -> None:
    docs = [paragraph_doc(tokenizer, [0, 3, 1]), None, paragraph_doc(tokenizer, [1, 3]), [5, -1]]
    queries = ["Who knows the vault code?", "q", "", "q"]
    out = rag_contexts(
        docs, queries, tokenizer=tokenizer, embedder=embedder, target_tokens=40, chunk_tokens=CHUNK
    )
    assert isinstance(out[0], RetrievalResult) and len(out[0].context_ids) == 40
    assert isinstance(out[1], ValueError) and "doc_ids" in str(out[1])
    assert isinstance(out[2], ValueError) and "query" in str(out[2])
    assert isinstance(out[3], ValueError) and "negative" in str(out[3])


def test_embedding_failure_is_isolated_to_its_request(tokenizer, embedder) -> None:
    counting = CountingEmbedder(embedder, poison="violin")
    docs = [paragraph_doc(tokenizer, [0, 3, 1]), paragraph_doc(tokenizer, [5, 2, 4])]
    out = rag_contexts(
        docs,
        ["Who knows the vault code?", "What was the score?"],
        tokenizer=tokenizer,
        embedder=counting,
        target_tokens=40,
        chunk_tokens=CHUNK,
    )
    assert isinstance(out[0], RetrievalResult) and "4417" in tokenizer.decode(out[0].context_ids)
    assert isinstance(out[1], RuntimeError)


# ----------------------------------------------------------------------------- stage
TEXT = (
    "The lighthouse keeper lit the lamp every evening at seven. Ships passing the rocky cape "
    "used its beam to steer clear of the reef. "
    "The harbour master recorded that the ferry Aurora carries exactly 312 passengers. "
    "In the village the bakery sold rye bread and the school had a small library. "
) * 3


def job_spec(target: int = 48, chunk: int = 16) -> dict[str, Any]:
    spec = JobSpec.model_validate(
        {
            "name": "rag-test",
            "input": {"uri": "memory://unused", "format": "jsonl", "question_field": "q"},
            "task": {"kind": "qa"},
            "compression": {"method": "rag", "target_tokens": target, "chunk_tokens": chunk},
        }
    )
    return spec.model_dump(mode="json")


def make_rows(tokenizer, n: int) -> list[dict[str, Any]]:
    doc = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    rows = []
    for i in range(n):
        rows.append(
            {
                "request_id": f"r{i}",
                "doc_ids": doc[: 40 + 30 * i],
                "question": "How many passengers does the ferry Aurora carry?",
                "instruction": "Answer briefly.",
                "error": None,
            }
        )
    return rows


@pytest.fixture(scope="module")
def stage() -> RagStage:
    return RagStage(job_spec())


def test_stage_adds_columns_and_keeps_every_row(stage: RagStage, tokenizer) -> None:
    rows = make_rows(tokenizer, 4)
    rows[1]["error"] = "read: file vanished"
    rows[1]["doc_ids"] = None
    rows[2]["doc_ids"] = None  # fails here, alone
    rows[3]["question"] = None  # summarize-style row: ranked against the instruction
    rows[3]["error"] = float("nan")  # how Ray may hand a null across mixed blocks
    out = batch_to_rows(stage(rows_to_batch(rows)))
    assert [r["request_id"] for r in out] == ["r0", "r1", "r2", "r3"]
    assert out[0]["context_ids"] == rows[0]["doc_ids"]  # 40 tokens fit the 48 budget
    assert out[0]["context_tokens"] == 40 and out[0]["error"] is None
    assert out[1]["error"] == "read: file vanished" and out[1]["context_ids"] is None
    assert out[2]["error"].startswith("rag: ValueError") and out[2]["context_ids"] is None
    assert out[3]["error"] is None and out[3]["context_tokens"] == 48
    assert len(out[3]["context_ids"]) == 48
    assert all(isinstance(r["compress_s"], float) for r in (out[0], out[3]))


def test_stage_retrieves_the_answer(stage: RagStage, tokenizer) -> None:
    rows = make_rows(tokenizer, 4)
    out = batch_to_rows(stage(rows_to_batch(rows)))
    assert "312" in tokenizer.decode(out[3]["context_ids"])


def test_stage_ranks_a_summary_request_against_its_instruction(stage: RagStage, tokenizer) -> None:
    rows = make_rows(tokenizer, 4)[3:]
    rows[0] |= {"question": None, "instruction": "Summarize what the lighthouse keeper does every evening."}
    (out,) = batch_to_rows(stage(rows_to_batch(rows)))
    kept = tokenizer.decode(out["context_ids"])
    assert "lit the lamp" in kept and "312" not in kept  # the instruction, not a question, ranked


def test_stage_rejects_other_methods() -> None:
    spec = job_spec()
    spec["compression"] = {"method": "none"}
    with pytest.raises(ValueError, match="rag"):
        RagStage(spec)


def test_stage_in_ray_data(ray_session, tokenizer) -> None:
    from ray.data import ActorPoolStrategy

    rows = make_rows(tokenizer, 5)
    rows[2]["error"] = "tokenize: too long"
    # One block per row: batches then span blocks whose error column is null in
    # some and string in others (Ray hands such nulls over as NaN).
    ds = ray_session.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        RagStage,
        fn_constructor_kwargs={"spec": job_spec()},
        compute=ActorPoolStrategy(size=1),
        num_gpus=0,
        batch_size=2,
        batch_format="numpy",
    )
    out = sorted(ds.take_all(), key=lambda r: r["request_id"])
    assert len(out) == len(rows)
    for src, got in zip(rows, out, strict=True):
        if src["error"]:
            assert got["error"] == src["error"]
            continue
        assert got["error"] is None
        assert got["context_tokens"] == min(48, len(src["doc_ids"]))
        assert len(np.asarray(got["context_ids"])) == got["context_tokens"]
