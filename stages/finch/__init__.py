"""Finch (Corallo & Papotti, TACL 2024): prompt-guided KV-cache compression by
chunked prefill. ``finch_prefill`` (prefill.py) is the entry point; the other
modules are its parts: schedule.py (how many entries survive each chunk),
selector.py (which entries: the paper's per-layer scoring or the retrieval-head
scoring), evidence.py (per-head normalisation and span pooling), scoring.py
(prompt query capture and the paper's score), heads.py (calibrated head sets per
model, found by fingerprint; shipped ones in heads/), calibrate.py (finding those
heads on synthetic needles: ``longdoc calibrate-heads``), rope.py (key
re-rotation), select.py (top-k gather per layer), support.py (architecture checks)."""

from stages.finch.prefill import check_supported, finch_prefill

__all__ = ["check_supported", "finch_prefill"]
