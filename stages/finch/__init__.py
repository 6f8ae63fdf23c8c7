"""Finch (Corallo & Papotti, TACL 2024): prompt-guided KV-cache compression by
chunked prefill, and the project's sentence selection built on its reading pass.

``finch_prefill`` (prefill.py) is the entry point; the other modules are its parts:
config.py (the settings of methods finch and select), schedule.py (how many entries
survive each chunk), shared.py (reading a document once for all its questions),
strategies.py (which entries each pass keeps: the paper's per-layer scoring or the
retrieval-head scoring), evidence.py (per-head normalisation and span pooling),
paper_scores.py (the paper's score), compaction.py (the kept entries of a layer, top-k
per row, gathered and re-rotated to contiguous positions), heads.py (calibrated head
sets per model, found by fingerprint; shipped ones in heads/), calibrate.py (finding
those heads on synthetic needles: ``longdoc calibrate-heads``), spans.py (sentences),
order.py and fusion.py (the text early exit reads: relevance order, the heads'
evidence fused with an embedder's), scorer.py (a smaller model reads and selects for
the generator, in sentences), support.py (architecture checks). The cache-editing
tools it shares with the AutoCompressor (decoder access, query capture, RoPE
re-rotation, slot gathering) live in stages/kv/.

Importing the package is light (settings only); the torch-heavy modules load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_supported", "finch_prefill"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stages.finch import prefill

        return getattr(prefill, name)
    raise AttributeError(name)
