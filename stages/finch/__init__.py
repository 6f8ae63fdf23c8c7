"""Finch (Corallo & Papotti, TACL 2024): prompt-guided KV-cache compression by
chunked prefill. ``finch_prefill`` (prefill.py) is the entry point; the other
modules are its parts: schedule.py (how many entries survive each chunk),
scoring.py (prompt attention over the cache), rope.py (key re-rotation),
select.py (top-k gather per layer), support.py (architecture checks)."""

from stages.finch.prefill import check_supported, finch_prefill

__all__ = ["check_supported", "finch_prefill"]
