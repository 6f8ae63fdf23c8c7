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


@pytest.fixture(scope="session")
def tiny_autocompressors(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """AutoCompressor checkpoints over the tiny model: ``vectors`` (3 summary vectors per
    segment) and ``kv`` (every 4th key/value kept), untrained (random summary embeddings)."""
    import torch

    from stages.autocompressor.checkpoint import save_autocompressor
    from stages.autocompressor.model import ACConfig, AutoCompressor
    from stages.model_loading import load_causal_lm

    lm, _ = load_causal_lm(str(tiny_model_dir))
    summary = torch.randn(3, lm.config.hidden_size, generator=torch.Generator().manual_seed(4)) * 0.2
    forms = {"vectors": AutoCompressor(lm, ACConfig(summary_length=3, accumulate_summary=True), summary),
             "kv": AutoCompressor(lm, ACConfig(summary_length=1, summary_form="kv", kv_stride=4))}
    return {name: save_autocompressor(ac, tmp_path_factory.mktemp(f"ac-{name}"), base_model=str(tiny_model_dir))
            for name, ac in forms.items()}


@pytest.fixture
def pages(tmp_path) -> Path:
    """Three held-out pages ({"id", "text"} per line), each a few hundred tokens."""
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps({"id": f"page-{i}", "text": qa_record(f"p{i}", 2 + i)["text"]}) + "\n"
                            for i in range(3)))
    return path
