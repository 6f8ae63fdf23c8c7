"""Nightly-job figures derived from a bench record: docs/hour and $ per 1,000 documents."""

from __future__ import annotations

import pytest

from pipeline.bench.nightly import nightly_figures


def _record() -> dict:
    return {"batch_size": 8, "systems": {
        "longdoc": {"status": "ok", "seconds": 4.0, "tok_s": 256.0},
        "longdoc-pld": {"status": "ok", "seconds": 2.0, "tok_s": 512.0},
        "hf-dynamic": {"status": "error", "error": "OutOfMemoryError"},
        "hf-static-compiled": {"status": "skipped", "reason": "not in --systems"},
    }}


def test_docs_per_hour_and_cost_per_thousand_documents():
    out = nightly_figures(_record(), usd_per_device_hour=2.5)
    assert set(out) == {"longdoc", "longdoc-pld"}  # failed and skipped systems get no figure
    # 8 documents every 4 s: 7,200 docs/hour; 1k documents = 500 s = 0.1389 device-hours at $2.5.
    g = out["longdoc"]
    assert g["batch_s"] == 4.0 and g["docs_per_hour"] == pytest.approx(7200.0)
    assert g["device_hours_per_1k"] == pytest.approx(1000 / 7200)
    assert g["usd_per_1k_docs"] == pytest.approx(500 * 2.5 / 3600)
    assert out["longdoc-pld"]["usd_per_1k_docs"] == pytest.approx(g["usd_per_1k_docs"] / 2)


def test_free_price_and_bad_price():
    assert nightly_figures(_record(), 0.0)["longdoc"]["usd_per_1k_docs"] == 0.0
    with pytest.raises(ValueError, match="--usd-per-device-hour -1.0: allowed: >= 0"):
        nightly_figures(_record(), -1.0)
