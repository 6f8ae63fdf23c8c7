"""Tiny inputs for the studies' smoke tests: a two-document QA set in the eval set's format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FACTS = [
    "The Danube flows through ten countries before it reaches the Black Sea.",
    "The lighthouse keeper of Vardo was named Ingrid Solheim.",
    "The museum in Tartu opened in the spring of 1911.",
    "Every Tuesday the ferry to Hiiumaa leaves at seven in the morning.",
]
FILLER = "The committee met again to read the minutes and approve the budget of the year."


def qa_record(doc_id: str, fact_at: int, n_sentences: int = 24) -> dict:
    """A document of filler sentences in paragraphs of four, with two facts, and two questions on them."""
    sentences = [FILLER] * n_sentences
    sentences[fact_at], sentences[-fact_at - 1] = FACTS[0], FACTS[1]
    text = "\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, n_sentences, 4))
    return {"id": doc_id, "text": text,
            "questions": ["Which sea does the Danube reach?", "Who kept the lighthouse of Vardo?"],
            "answers": ["the Black Sea", "Ingrid Solheim"], "depths": [0.2, 0.8], "kind": ["inserted", "native"]}


@pytest.fixture
def qa_set(tmp_path) -> Path:
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(qa_record(f"doc-{i}", 3 + i)) + "\n" for i in range(2)))
    return path
