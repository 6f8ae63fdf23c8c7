"""The sentence embedder (stages/embedding.py) with the real embedded all-MiniLM-L6-v2:
its window in word pieces, uncut word-piece counts, L2-normalised embeddings."""

from __future__ import annotations

import pytest
import torch

from schemas.spec import EMBEDDED_EMBEDDER
from stages.embedding import SentenceEmbedder, load_embedder


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return load_embedder(EMBEDDED_EMBEDDER, "cpu", batch_size=4)


def test_window_and_counts_are_the_models_own(embedder: SentenceEmbedder) -> None:
    assert embedder.model.max_seq_length == 256
    assert embedder.max_tokens == 254  # [CLS] and [SEP] take two places
    long = "ferry " * 400  # longer than the window: counted uncut
    pieces = embedder.model.tokenizer.tokenize("ferry Aurora")
    assert embedder.count_tokens(["", "ferry Aurora", long]) == [0, len(pieces), 400]


def test_embeddings_are_normalised(embedder: SentenceEmbedder) -> None:
    q = embedder.embed_queries(["Which ferry?"])
    c = embedder.embed_chunks(["The ferry Aurora.", "Tomatoes grow in warm soil."])
    assert q.shape == (1, c.shape[1]) and c.shape[0] == 2
    assert torch.allclose(c.norm(dim=1), torch.ones(2), atol=1e-4)
    scores = (c @ q[0]).tolist()
    assert scores[0] > scores[1]


def test_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        SentenceEmbedder(object(), batch_size=0)
