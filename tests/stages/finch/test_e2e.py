"""End to end with the embedded SmolLM2: a fact in the middle of a long real
document survives 8x compression and the model answers from it: Finch as the paper
wrote it (kept KV entries), and select's sentences (read once per document, then
prefilled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.spec import DEFAULT_QA_INSTRUCTION
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.finch import finch_prefill
from stages.finch.config import FinchCompression, SelectCompression
from stages.finch.spans import sentence_boundaries
from stages.prompting import PromptBuilder

CORPUS = Path(__file__).resolve().parents[3] / "jobs" / "corpus"
NEEDLE = "The password for the vault is pelican."
QUESTION = "What is the password for the vault?"


@pytest.mark.e2e
@pytest.mark.parametrize("keep", ["tokens", "sentences"])
def test_answer_from_the_middle_of_a_document_8x_the_budget(embedded_model, keep) -> None:
    """keep tokens: method finch's defaults (the paper); sentences: method select's, heads'
    evidence only (the embedder is another test's)."""
    model, tok = embedded_model
    builder = PromptBuilder(tok)
    text = "".join(p.read_text() + "\n\n" for p in sorted(CORPUS.glob("*.txt"))[5:8])
    hay = builder.encode_text(text)[:4000]
    half = len(hay) // 2
    doc = builder.encode_text(
        tok.decode(hay[:half]).rstrip() + "\n\n" + NEEDLE + "\n\n" + tok.decode(hay[half:]).lstrip()
    )
    assert "pelican" not in text and len(doc) >= 8 * 500
    parts = builder.build(doc, DEFAULT_QA_INSTRUCTION, QUESTION)
    if keep == "tokens":
        cfg = FinchCompression(target_tokens=512, chunk_tokens=256)
    else:
        cfg = SelectCompression(target_tokens=512, chunk_tokens=256, evidence="heads", order="document",
                                min_relevance=0.0)
    bounds = sentence_boundaries(tok) if keep == "sentences" else None
    out = finch_prefill(model, [parts], cfg, tok.pad_token_id, boundaries=bounds)
    assert out.context_tokens == [512]
    config = DecodeConfig(max_new_tokens=16, eos_ids=frozenset({tok.eos_token_id}))
    answer = tok.decode(decode_plain(model, out.state, config)[0].tokens)
    assert "pelican" in answer.lower(), answer
