"""How a document is split into chunks and how many of its entries survive each one.

The Finch paper fixes a compression rate sigma = |D| / target and lets every chunk
add its share ``|chunk| / sigma`` to the cache: after reading chunk i the cache
holds (about) ``n_i / sigma`` document entries, where ``n_i`` is the number of
document tokens read so far; the selection at each step ranks the old kept entries
and the new chunk together, so an old entry can be evicted by a better new one.
The authors' code rounds sigma up to an integer and floors per chunk, which lands
a little under the target, and counts the prompt inside the target (sigma from
target - |prompt|); here ``target_tokens`` counts document entries only (the prompt's
entries come on top), so at one target this keeps the prompt's length and the rounding
more document entries than that code: compare budgets with that in mind. We keep the
same linear schedule with exact arithmetic:

    kept_i = floor(T * n_i / N),   T = min(target, N)

so the cache ends at exactly ``T`` entries (``n_last = N``), never holds more than
``T``, and a document no longer than the target keeps every token.
"""

from __future__ import annotations


def chunk_spans(doc_len: int, chunk_tokens: int) -> list[tuple[int, int]]:
    """[start, end) token spans of the document's chunks, in order (none if empty)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    return [(s, min(s + chunk_tokens, doc_len)) for s in range(0, doc_len, chunk_tokens)]


def kept_after_chunks(doc_len: int, target_tokens: int, chunk_tokens: int) -> list[int]:
    """Document entries kept in the cache after each chunk (one value per chunk).

    Non-decreasing, each step grows by at most the chunk's length (so the top-k
    never asks for more entries than there are candidates), and the last value is
    exactly ``min(target_tokens, doc_len)``.
    """
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    budget = min(target_tokens, doc_len)
    return [budget * end // doc_len for _, end in chunk_spans(doc_len, chunk_tokens)]
