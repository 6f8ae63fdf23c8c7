"""Eval scoring, aggregation, tables and plot on synthetic output rows."""

from __future__ import annotations

import csv
import struct

import pytest

from pipeline.eval.plot import plot_eval
from pipeline.eval.table import (
    SUMMARY_COLUMNS,
    aggregate,
    aggregate_ratio,
    breakdown,
    depth_bin,
    per_style,
    score_rows,
    to_markdown,
    write_csv,
)

META = {
    ("d1", "What is the code?"): {"kind": "inserted", "style": "echoed", "depth": 0.12},
    ("d1", "Who wrote it?"): {"kind": "native", "style": "paraphrased", "depth": 0.95},
    ("d2", "What is the code?"): {"kind": "inserted", "style": "echoed", "depth": 0.5},
}


def out_row(doc: str, q: str, ref: str, text: str | None, error: str | None = None, **figs):
    base = dict(
        doc_tokens=4000, context_tokens=500, compression_ratio=8.0, compress_s=0.5, device_s=1.5, e2e_s=2.0
    )
    base.update(figs)
    if error:
        base.update(context_tokens=None, compression_ratio=None, compress_s=None, device_s=None, e2e_s=None)
    return dict(doc_id=doc, prompt=q, reference=ref, output_text=text, error=error, **base)


def scored_rows():
    rag = [
        out_row("d1", "What is the code?", "4417", "The code is 4417."),
        out_row("d1", "Who wrote it?", "Ada Lovelace", "Ada Lovelace", e2e_s=4.0, device_s=2.5),
        out_row("d2", "What is the code?", "88", None, error="generate: boom"),
    ]
    none = [
        out_row("d1", "What is the code?", "4417", "4417", compression_ratio=1.0),
        out_row("d1", "Who wrote it?", "Ada Lovelace", "Lovelace", compression_ratio=1.0),
        out_row("d2", "What is the code?", "88", "no idea", compression_ratio=1.0),
    ]
    trunc = [out_row("d1", "What is the code?", "4417", "x", compression_ratio=4.0)]
    return (
        score_rows("rag", 512, rag, META)
        + score_rows("truncate", 1024, trunc, META)
        + score_rows("none", None, none, META)
        + score_rows("truncate", 512, trunc, META)
    )


def test_score_rows_joins_meta_and_zeroes_errors() -> None:
    s = scored_rows()[:3]
    assert s[0]["kind"] == "inserted" and s[0]["depth_bin"] == "0.0-0.2"
    assert (s[0]["exact_match"], s[0]["contains"]) == (0.0, 1.0)
    assert s[1]["exact_match"] == 1.0 and s[1]["kind"] == "native"
    assert s[2]["f1"] == 0.0 and s[2]["error"] == "generate: boom"


def test_aggregate_orders_and_averages() -> None:
    summary = aggregate(scored_rows(), wall_s={("rag", 512): 30.0})
    assert [(r["method"], r["target_tokens"]) for r in summary] == [
        ("none", None), ("truncate", 512), ("truncate", 1024), ("rag", 512),
    ]  # fmt: skip
    rag = summary[3]
    assert rag["n"] == 3 and rag["failed"] == 1
    assert rag["contains"] == pytest.approx(2 / 3)  # the error row counts as wrong
    assert rag["exact_match"] == pytest.approx(1 / 3)
    assert rag["e2e_s"] == pytest.approx(3.0)  # cost figures: successful rows only
    assert rag["device_s"] == pytest.approx(2.0)  # what a question costs at a price per device hour
    assert rag["compression_ratio"] == pytest.approx(8.0)
    assert rag["wall_s_per_request"] == pytest.approx(10.0)
    none = summary[0]
    assert none["f1"] == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)
    assert none["wall_s_per_request"] is None


def test_the_compression_ratio_is_tokens_given_over_tokens_read_not_a_mean_of_rows() -> None:
    """One question keeping 9 tokens of 2,754 (ratio 306) beside two keeping 500 of 3,000:
    the run read 8,754 / 1,009 = 8.7x less, not the 106x a mean of rows says."""
    rows = [out_row("d1", "What is the code?", "4417", "4417", doc_tokens=2754, context_tokens=9),
            out_row("d1", "Who wrote it?", "Ada Lovelace", "Ada", doc_tokens=3000, context_tokens=500),
            out_row("d2", "What is the code?", "88", "88", doc_tokens=3000, context_tokens=500),
            out_row("d2", "What is the code?", "88", None, error="generate: boom", doc_tokens=9000)]
    (s,) = aggregate(score_rows("rag", 512, rows, META))
    assert s["compression_ratio"] == pytest.approx(8754 / 1009)
    assert s["context_tokens"] == pytest.approx(1009 / 3)  # still a mean per question
    assert aggregate_ratio([]) is None and aggregate_ratio([{"doc_tokens": 5, "context_tokens": 0}]) is None


def test_breakdowns_by_kind_and_depth() -> None:
    kinds = breakdown(scored_rows(), "kind")
    rag = {r["kind"]: r for r in kinds if r["method"] == "rag"}
    assert rag["inserted"]["n"] == 2 and rag["inserted"]["contains"] == pytest.approx(0.5)
    assert rag["native"]["exact_match"] == 1.0
    depths = {r["depth_bin"] for r in breakdown(scored_rows(), "depth_bin")}
    assert depths == {"0.0-0.2", "0.4-0.6", "0.8-1.0"}
    assert depth_bin(1.0) == "0.8-1.0" and depth_bin(None) is None


def test_per_style_puts_every_method_beside_each_style() -> None:
    table = per_style(scored_rows())
    assert [(r["method"], r["target_tokens"]) for r in table] == [
        ("none", None), ("truncate", 512), ("truncate", 1024), ("rag", 512),
    ]  # fmt: skip
    columns = ["method", "target_tokens", "echoed (n=2)", "paraphrased (n=1)", "all (n=3)"]
    assert all(list(r) == columns for r in table)  # distinct questions per style, every row
    rag = table[3]
    assert rag["echoed (n=2)"] == pytest.approx(0.5)  # d1 right, d2 an error row
    assert rag["paraphrased (n=1)"] == 1.0 and rag["all (n=3)"] == pytest.approx(2 / 3)
    trunc = table[1]  # ran one echoed question only: no paraphrased figure
    assert trunc["echoed (n=2)"] == 0.0 and trunc["paraphrased (n=1)"] is None
    assert per_style([dict(r, style=None) for r in scored_rows()]) == []  # an unstyled set
    md = to_markdown(table).splitlines()
    assert md[0] == "| " + " | ".join(columns) + " |"
    assert md[5] == "| rag | 512 | 0.500 | 1.000 | 0.667 |"


def test_markdown_and_csv(tmp_path) -> None:
    summary = aggregate(scored_rows())
    md = to_markdown(summary, SUMMARY_COLUMNS).splitlines()
    assert md[0].startswith("| task | method | target_tokens | equal_to | n |") and len(md) == 2 + len(summary)
    assert md[2].startswith("| qa | none | - | - | 3 | 0 |")
    write_csv(summary, tmp_path / "s.csv", SUMMARY_COLUMNS)
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert [r["method"] for r in rows] == ["none", "truncate", "truncate", "rag"]
    assert float(rows[3]["contains"]) == pytest.approx(2 / 3)


def test_plot_writes_png(tmp_path) -> None:
    scored = scored_rows()
    path = plot_eval(aggregate(scored), breakdown(scored, "depth_bin"), tmp_path / "p" / "eval.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 1000 and height > 600


def test_recall_is_scored_from_kept_spans_and_averaged_over_rows_that_have_it(tmp_path) -> None:
    from pipeline.eval.plot import plot_cost_quality
    from pipeline.eval.recall import Evidence

    evidence = {
        ("d1", "What is the code?"): Evidence(sentence=(100, 110), answer=(107, 109), doc_tokens=4000),
        ("d1", "Who wrote it?"): Evidence(sentence=(3000, 3010), answer=(3001, 3003), doc_tokens=4000),
        ("d2", "What is the code?"): Evidence(sentence=(5, 9), answer=(6, 7), doc_tokens=4000),
    }
    rows = [
        out_row("d1", "What is the code?", "4417", "no", kept_spans=[0, 500]),  # kept, answered wrong
        out_row("d1", "Who wrote it?", "Ada Lovelace", "Ada Lovelace", kept_spans=[0, 500]),  # right, unkept
        out_row("d2", "What is the code?", "88", None, error="generate: boom", kept_spans=[0, 500]),
    ]
    scored = score_rows("bm25", 60, rows, META, evidence)
    assert [r["evidence_recall"] for r in scored] == [1.0, 0.0, None]  # a failed row has no recall
    (s,) = aggregate(scored, {("bm25", 60): 9.0}, equal_to={("bm25", 60): "finch@512"})
    assert s["equal_to"] == "finch@512" and s["recall_n"] == 2
    assert s["evidence_recall"] == 0.5 and s["contains"] == pytest.approx(1 / 3)
    recall = per_style(scored, "evidence_recall")
    assert recall[0]["echoed (n=2)"] == 1.0 and recall[0]["paraphrased (n=1)"] == 0.0
    no_spans = score_rows("autocompressor", None, [out_row("d1", "Who wrote it?", "Ada", "Ada")], META, evidence)
    assert no_spans[0]["evidence_recall"] is None  # summary vectors: no positions to check
    path = plot_cost_quality([s, *aggregate(scored_rows())], tmp_path / "cq.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_summary_column_a_reader_scores_by_is_defined_under_the_table():
    """A helper reading the eval table could not tell exact_match 0.000 from the accuracy to read."""
    from pipeline.eval.table import COLUMN_LEGEND, SUMMARY_COLUMNS, legend

    named = set(SUMMARY_COLUMNS) - {"task", "method", "target_tokens"}
    assert named <= set(COLUMN_LEGEND), named - set(COLUMN_LEGEND)
    text = legend(SUMMARY_COLUMNS)
    assert "- `contains`: " in text and "the accuracy to read" in text and "- `task`" not in text
    assert text.index("`exact_match`") < text.index("`evidence_recall`")  # the table's order
