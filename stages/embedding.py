"""Sentence embedders for chunk retrieval (stages/compression/rag.py).

Contract: ``TextEmbedder`` embeds texts as L2-normalised vectors ``[N, E]`` (so a dot
product is cosine similarity) and says how many word pieces of a text it reads
(``max_tokens``: its window less its special tokens) and how many a text has
(``count_tokens``: uncut, no specials), so callers can keep chunks inside the window
instead of letting the model cut them silently. ``load_embedder`` loads a
sentence-transformers model by id, path or the embedded sentinel name; torch and
sentence-transformers load inside it, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class TextEmbedder(Protocol):
    """Embeds texts as L2-normalised vectors (so a dot product is cosine similarity).

    ``max_tokens``: word pieces of a text the embedder reads (its window less its
    special tokens); ``count_tokens``: each text's word pieces, uncut, no specials.
    """

    max_tokens: int

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def embed_queries(self, texts: list[str]) -> torch.Tensor: ...  # [N, E]

    def embed_chunks(self, texts: list[str]) -> torch.Tensor: ...  # [N, E]


class SentenceEmbedder:
    """``TextEmbedder`` over a sentence-transformers model.

    Uses the model's query/document encoders where the installed
    sentence-transformers has them (models with retrieval prompts, e.g. e5, need
    them); for symmetric models such as all-MiniLM-L6-v2 both equal ``encode``.
    """

    def __init__(self, model: Any, batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"embed batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = batch_size
        tok = model.tokenizer
        window = int(getattr(model, "max_seq_length", None) or tok.model_max_length)
        # The window counts the special tokens ([CLS] ... [SEP]) the embedder adds.
        self.max_tokens = window - len(tok("")["input_ids"])

    def count_tokens(self, texts: list[str]) -> list[int]:
        enc = self.model.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def _encode(self, method: str, texts: list[str]) -> torch.Tensor:
        fn = getattr(self.model, method, None) or self.model.encode
        emb = fn(
            texts,
            batch_size=self.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return emb.detach().float().cpu()  # [N, E]

    def embed_queries(self, texts: list[str]) -> torch.Tensor:
        return self._encode("encode_query", texts)

    def embed_chunks(self, texts: list[str]) -> torch.Tensor:
        return self._encode("encode_document", texts)


def load_embedder(name: str, device: torch.device | str = "cpu", batch_size: int = 64) -> SentenceEmbedder:
    """Load a sentence-transformers model by id, path or the embedded sentinel name."""
    from sentence_transformers import SentenceTransformer

    from stages.model_loading import resolve_embedder

    return SentenceEmbedder(
        SentenceTransformer(resolve_embedder(name), device=str(device)), batch_size
    )
