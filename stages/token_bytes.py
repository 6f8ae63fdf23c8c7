"""Each token's bytes, and where a cut in a token sequence falls between characters.

Why: a byte-level BPE tokenizer (SmolLM2, Llama 3, Qwen2) splits a character of CJK text,
an emoji or an accented letter across tokens, and a SentencePiece tokenizer with byte
fallback writes a rare one as ``<0xNN>`` pieces. A method that cuts ids at a token count
(truncate's edges, rag's and bm25's chunks, the last kept chunk's end) could split one: the
reader sees a stray byte where the cut was, and the ``context`` column a U+FFFD. Cuts
move to the nearest edge between characters instead (``CharacterEdges``). Tokenizers keep
no table of this, so it is read once per tokenizer from its vocabulary (~0.15 s for
49,152 ids).

Contract:
- ``token_bytes(tokenizer)``: each token id's UTF-8 bytes (see the function).
- ``CharacterEdges.of(tokenizer)``: the ids whose bytes begin inside a character (a UTF-8
  continuation byte, 0x80-0xBF). A cut before position ``i`` of ``ids`` is clean when
  ``i`` is 0 or ``len(ids)`` or ``ids[i]`` begins a character; ``before(ids, i, lo)`` is the
  last clean cut in ``[lo, i]`` (``lo`` when none is), ``after(ids, i, hi)`` the first in
  ``[i, hi]`` (``hi`` when none is). ``NO_EDGES`` calls every cut clean (a tokenizer of
  whole characters; plain id lists in tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def _byte_level_alphabet() -> dict[str, int]:
    """The printable character byte-level BPE tokenizers (GPT-2's scheme: SmolLM2, Llama 3,
    Qwen2) write for each byte in their vocabulary: printable Latin-1 bytes stand for
    themselves, the others for code points from 256 on, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + extra)] = byte
            extra += 1
    return alphabet


def token_bytes(tokenizer, texts: list[str] | None = None) -> tuple[bytes, ...]:
    """Each token id's UTF-8 bytes. A token that decodes to whole characters is its text's
    bytes (a SentencePiece word piece keeps its leading space); one that holds part of a
    character (it decodes to U+FFFD) is read from its vocabulary entry: ``<0xNN>`` (byte
    fallback) or the byte-level alphabet. A part that neither explains reads as one
    continuation byte (0x80): never a clean place to cut, never a sentence end."""
    texts = texts if texts is not None else [tokenizer.decode([i]) for i in range(len(tokenizer))]
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(texts))))
    alphabet = _byte_level_alphabet()
    out = []
    for text, piece in zip(texts, pieces, strict=True):
        piece = piece or ""
        if "\ufffd" not in text:
            lead = " " if piece.startswith("\u2581") and not text.startswith(" ") else ""
            out.append((lead + text).encode("utf-8"))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif piece and all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        else:
            out.append(b"\x80")
    return tuple(out)




@dataclass(frozen=True)
class CharacterEdges:
    """Which token ids begin inside a character (module contract)."""

    inside: frozenset[int]

    @classmethod
    def of(cls, tokenizer) -> CharacterEdges:
        """``tokenizer``'s edges (~0.15 s: read once per stage, which keeps them)."""
        return cls(frozenset(i for i, b in enumerate(token_bytes(tokenizer)) if b and 0x80 <= b[0] < 0xC0))

    def clean(self, ids: Sequence[int], i: int) -> bool:
        """Whether a cut before ``ids[i]`` falls between characters."""
        return i <= 0 or i >= len(ids) or ids[i] not in self.inside

    def before(self, ids: Sequence[int], i: int, lo: int = 0) -> int:
        """The last clean cut in ``[lo, i]``; ``lo`` when none is (a character longer than
        the span: keep nothing of it rather than part of it)."""
        while i > lo and not self.clean(ids, i):
            i -= 1
        return i

    def after(self, ids: Sequence[int], i: int, hi: int | None = None) -> int:
        """The first clean cut in ``[i, hi]`` (``hi`` defaults to ``len(ids)``)."""
        hi = len(ids) if hi is None else hi
        while i < hi and not self.clean(ids, i):
            i += 1
        return i


NO_EDGES = CharacterEdges(frozenset())

