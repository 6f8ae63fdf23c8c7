"""Benchmarks: one process, side-by-side measurements, ratios and PASS/FAIL per target."""
