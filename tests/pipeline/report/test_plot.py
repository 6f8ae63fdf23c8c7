"""`longdoc report --plot`: a real PNG from a table with the output schema, 1 to 60 runs."""

from __future__ import annotations

import random

import matplotlib.image as mpimg
import pyarrow as pa
import pytest

from pipeline.report.plot import failures_by_kind, per_run_summaries, plot_report
from schemas.output import OUTPUT_SCHEMA, rows_to_table


def _rows(run_id: str, date: str, n: int, drafted: int, seed: int, failed: int = 1,
          kinds: tuple[str, ...] = ("input",)) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        e2e = 0.5 + i * 0.1
        bad = i >= n - failed
        rows.append({
            "run_id": run_id, "run_date": date, "job": "j", "doc_id": f"d{i}", "request_id": f"{run_id}-{i}",
            "output_tokens": 20 + i, "prompt_tokens": 500, "draft_tokens": drafted,
            "accepted_tokens": drafted // 2, "e2e_s": e2e, "device_s": e2e, "cost_usd": e2e * 0.001,
            "compression_ratio": rng.uniform(1, 4), "error": "boom" if bad else None,
            "error_kind": kinds[i % len(kinds)] if bad else None,
        })
    return rows


def _many_runs(n_runs: int) -> pa.Table:
    """Synthetic nightly history: one run per date, a few reruns, varied failures."""
    rows: list[dict] = []
    for r in range(n_runs):
        date = f"2026-{1 + r // 28:02d}-{1 + r % 28:02d}"
        rows += _rows(f"2026{r:04d}T020000Z-{r:06x}", date, 8 + r % 5, 16 * (r % 3), r,
                      failed=r % 4, kinds=("input", "retryable"))
    return rows_to_table(rows)


def _png(path) -> object:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 900 and img.shape[1] > 1200
    assert img[..., :3].std() > 0.05  # something was drawn, not a blank canvas
    return img


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
    _png(out)


def test_failures_are_counted_per_run_and_kind():
    table = rows_to_table(_rows("a", "2026-01-01", 6, 0, 0, failed=3, kinds=("input", "retryable"))
                          + _rows("b", "2026-01-02", 4, 0, 0, failed=0))
    runs = per_run_summaries(table)
    # rows 3, 4, 5 failed; kinds alternate by row index: retryable, input, retryable
    assert failures_by_kind(table, runs) == {"input": [1, 0], "retryable": [2, 0]}
    no_kind = table.drop_columns(["error_kind"])
    assert failures_by_kind(no_kind, runs) == {"error": [3, 0]}
    # Each run's failures go to that run, wherever it stands in the list.
    assert failures_by_kind(table, runs[::-1]) == {"input": [0, 1], "retryable": [0, 2]}
    # Runs are ordered by date first: a run id that sorts first but ran later comes later.
    later_id_first = rows_to_table(_rows("z-run", "2026-01-01", 2, 0, 0, failed=0)
                                   + _rows("a-run", "2026-01-02", 2, 0, 0, failed=0))
    assert [s["run_id"] for s in per_run_summaries(later_id_first)] == ["z-run", "a-run"]


@pytest.mark.parametrize("n_runs", [1, 60])
def test_plot_is_the_same_size_for_1_and_60_runs(tmp_path, n_runs):
    table = _many_runs(n_runs)
    out = tmp_path / f"runs{n_runs}.png"
    plot_report(table, str(out))
    img = _png(out)
    # Fixed figure: 60 runs do not make a 100-inch wide image (the old plot grew per run).
    assert img.shape[:2] == (1210, 1430)


def test_last_keeps_only_the_newest_runs(tmp_path):
    table = _many_runs(60)
    runs = per_run_summaries(table)
    drawn = plot_report(table, str(tmp_path / "a.png"), summaries=runs, last=30)
    assert [s["run_id"] for s in drawn] == [s["run_id"] for s in runs[-30:]]
    assert len(plot_report(table, str(tmp_path / "b.png"), last=100)) == 60


def test_plot_uses_given_summaries_and_rejects_bad_input(tmp_path):
    table = rows_to_table(_rows("r1", "2026-01-01", 3, 4, 0))
    s = per_run_summaries(table)[0] | {"throughput_basis": "wall", "docs_per_s": 2.0}
    plot_report(table, str(tmp_path / "a.png"), summaries=[s])
    assert (tmp_path / "a.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="no rows"):
        plot_report(rows_to_table([]), str(tmp_path / "b.png"))
    with pytest.raises(ValueError, match="last=0"):
        plot_report(table, str(tmp_path / "c.png"), last=0)
