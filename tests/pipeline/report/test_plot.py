"""`longdoc report --plot`: a real PNG from a table with the output schema."""

from __future__ import annotations

import random

import matplotlib.image as mpimg
import pytest

from pipeline.report.plot import per_run_summaries, plot_report
from schemas.output import OUTPUT_SCHEMA, rows_to_table


def _rows(run_id: str, date: str, n: int, drafted: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        e2e = 0.5 + i * 0.1
        rows.append({
            "run_id": run_id, "run_date": date, "job": "j", "doc_id": f"d{i}", "request_id": f"{run_id}-{i}",
            "output_tokens": 20 + i, "prompt_tokens": 500, "draft_tokens": drafted,
            "accepted_tokens": drafted // 2, "e2e_s": e2e, "device_s": e2e, "cost_usd": e2e * 0.001,
            "compression_ratio": rng.uniform(1, 4), "error": "boom" if i == n - 1 else None,
        })
    return rows


def test_plot_writes_png_and_summaries_match(tmp_path):
    table = rows_to_table(_rows("r2", "2026-01-02", 6, 0, 1) + _rows("r1", "2026-01-01", 11, 8, 2))
    assert table.schema.equals(OUTPUT_SCHEMA, check_metadata=False)
    runs = per_run_summaries(table)
    assert [(s["run_date"], s["run_id"]) for s in runs] == [("2026-01-01", "r1"), ("2026-01-02", "r2")]
    first, second = runs
    # ok rows of run r1 have e2e 0.5..1.4 (the last row failed): median 0.95
    assert first["p50_e2e_s"] == pytest.approx(0.95)
    assert first["acceptance_rate"] == pytest.approx(0.5) and second["acceptance_rate"] is None
    assert first["failed"] == 1 and first["rows"] == 11

    out = tmp_path / "report.png"
    plot_report(table, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[0] > 500 and img.shape[1] > 800
    assert img[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_plot_uses_given_summaries_and_rejects_empty(tmp_path):
    table = rows_to_table(_rows("r1", "2026-01-01", 3, 4, 0))
    s = per_run_summaries(table)[0] | {"throughput_basis": "wall", "docs_per_s": 2.0}
    plot_report(table, str(tmp_path / "a.png"), summaries=[s])
    assert (tmp_path / "a.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows"):
        plot_report(rows_to_table([]), str(tmp_path / "b.png"))
