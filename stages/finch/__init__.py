"""Finch (Corallo & Papotti, TACL 2024): prompt-guided KV-cache compression by
chunked prefill. ``finch_prefill`` (prefill.py) is the entry point; the other
modules are its parts: schedule.py (how many entries survive each chunk),
strategies.py (which entries each pass keeps: the paper's per-layer scoring or the
retrieval-head scoring), evidence.py (per-head normalisation and span pooling),
paper_scores.py (the paper's score), compaction.py (the kept entries of a layer,
top-k per row, gathered and re-rotated to contiguous positions), heads.py
(calibrated head sets per model, found by fingerprint; shipped ones in heads/),
calibrate.py (finding those heads on synthetic needles: ``longdoc calibrate-heads``),
spans.py (sentences), order.py and fusion.py (the text early exit reads: relevance
order, the heads' evidence fused with an embedder's), support.py (architecture
checks). The cache-editing tools it shares with the AutoCompressor (decoder access,
query capture, RoPE re-rotation, slot gathering) live in stages/kv/."""

from stages.finch.prefill import check_supported, finch_prefill

__all__ = ["check_supported", "finch_prefill"]
