"""`longdoc eval` end to end: the real pipeline (Ray Data, tiny model) per method and
budget, scored, tabled and plotted."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeline.eval.runner import eval_command

FILLER = (
    "The committee met in the old library to review the archive. Members read reports about "
    "roads, bridges and the harbour, and agreed to meet again after the summer. "
)


def eval_set(tmp_path):
    recs = [
        {
            "id": "doc-a",
            "text": FILLER * 4 + "The vault code of the Zurich branch is 4417. " + FILLER * 4,
            "questions": [
                "What is the vault code of the Zurich branch?",
                "Where did the committee meet?",
            ],
            "answers": ["4417", "old library"],
            "depths": [0.5, 0.0],
            "kind": ["inserted", "native"],
            "style": ["echoed", "paraphrased"],
        },
        {
            "id": "doc-b",
            "text": FILLER * 6 + "The ferry Aurora carries 312 passengers.",
            "questions": ["How many passengers does the ferry Aurora carry?"],
            "answers": ["312"],
            "depths": [0.98],
            "kind": ["inserted"],
            "style": ["echoed"],
        },
    ]
    p = tmp_path / "qa-eval.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_eval_command_end_to_end(tmp_path, tiny_model_dir, ray_session) -> None:
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)  # two commands, so `eval` is a subcommand as in the CLI
    out = tmp_path / "eval-out"
    args = [
        "eval", "--eval-set", str(eval_set(tmp_path)), "--target-tokens", "64",
        "--methods", "truncate,rag", "--max-new-tokens", "3", "--out", str(out),
        "--set", f"generation.model={tiny_model_dir}", "--set", "rag:compression.chunk_tokens=16",
        "--eval-id", "e1", "--equal-reading", "truncate", "--equal-methods", "bm25",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    # No cluster and one generate actor: each run in this process, as `longdoc run` would.
    assert res.output.count("runner local: in this process, no Ray") == 3
    assert "| qa | truncate | 64 | - | 3 | 0 |" in res.output and "| qa | rag | 64 | - | 3 | 0 |" in res.output
    assert "| qa | bm25 | 64 | truncate@64 | 3 | 0 |" in res.output  # equal reading: truncate read 64
    assert "### contains by question style" in res.output
    assert "| method | target_tokens | echoed (n=2) | paraphrased (n=1) | all (n=3) |" in res.output

    d = out / "e1"
    summary = json.loads((d / "summary.json").read_text())
    assert summary["runs"] == ["truncate-64", "rag-64"] and summary["failed_runs"] == {}
    assert [s["n"] for s in summary["summary"]] == [3, 3, 3]
    assert [(r["method"], r["target_tokens"]) for r in summary["by_style"]] == [
        ("truncate", 64), ("rag", 64), ("bm25", 64)]  # fmt: skip
    # Evidence recall, whatever the reader said: truncate (head_tail, 32 + 32 tokens) keeps
    # doc-a's opening (the native answer) and doc-b's last sentence, not doc-a's middle.
    recall = {s["method"]: s["evidence_recall"] for s in summary["summary"]}
    assert recall["truncate"] == 2 / 3 and recall["rag"] == 1.0
    by_q = {r["method"]: r for r in summary["recall_by_style"]}
    assert by_q["truncate"]["echoed (n=2)"] == 0.5 and by_q["truncate"]["paraphrased (n=1)"] == 1.0
    assert "### evidence recall by question style" in res.output
    assert (d / "cost_quality.png").read_bytes()[:4] == b"\x89PNG"
    styles = {(r["method"], r["style"]): r["n"] for r in summary["by_style_detail"]}
    assert styles[("rag", "echoed")] == 2 and styles[("rag", "paraphrased")] == 1
    kinds = {(r["method"], r["kind"]): r["n"] for r in summary["by_kind"]}
    assert kinds == {("truncate", "inserted"): 2, ("truncate", "native"): 1, ("rag", "inserted"): 2,
                     ("rag", "native"): 1, ("bm25", "inserted"): 2, ("bm25", "native"): 1}  # fmt: skip

    import csv

    scored = list(csv.DictReader((d / "scored.csv").open()))
    assert len(scored) == 9
    truncated = {r["question"]: r["evidence_recall"] for r in scored if r["method"] == "truncate"}
    assert truncated["What is the vault code of the Zurich branch?"] == "0.0"
    assert truncated["How many passengers does the ferry Aurora carry?"] == "1.0"
    refs = {r["question"]: r["reference"] for r in scored}
    assert refs["How many passengers does the ferry Aurora carry?"] == "312"
    for r in scored:
        assert r["error"] == "" and int(r["context_tokens"]) == 64
        assert float(r["compression_ratio"]) == int(r["doc_tokens"]) / 64
        assert 0.0 <= float(r["f1"]) <= 1.0
    assert (d / "eval.png").read_bytes()[:4] == b"\x89PNG"
    assert (d / "runs" / "rag-64").is_dir() and (d / "summary.csv").is_file()

    # Resumed under the same eval id (here through Ray), a finished budget's rows are kept and
    # its time is both attempts' (the first attempt's record is not overwritten by the rerun
    # that found it done).
    rerun = [
        "eval", "--eval-set", str(eval_set(tmp_path)), "--target-tokens", "64", "--methods", "truncate",
        "--max-new-tokens", "3", "--out", str(out), "--set", f"generation.model={tiny_model_dir}",
        "--eval-id", "e1", "--runner", "ray",
    ]  # fmt: skip
    res = CliRunner().invoke(app, rerun)
    assert res.exit_code == 0, res.output
    assert "3 row(s) of the date already written" in res.output and "runner local" not in res.output
    first_wall = summary["summary"][0]["wall_s_per_request"] * 3
    resumed = json.loads((d / "summary.json").read_text())["summary"][0]
    (record,) = (d / "runs").glob("truncate-64.runs/*/e1.json")
    attempts = json.loads(record.read_text())["summary"]
    assert attempts["earlier_attempts"][0]["wall_s"] == pytest.approx(first_wall)
    assert resumed["wall_s_per_request"] == pytest.approx(attempts["wall_s_all_attempts"] / 3)
    assert resumed["wall_s_per_request"] * 3 > first_wall


def test_eval_command_rejects_bad_values(tmp_path) -> None:
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)
    p = eval_set(tmp_path)
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(p), "--methods", "zip"])
    assert res.exit_code == 2 and "unknown method" in res.output
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "not found" in res.output
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(p), "--set", "compression.keep=head"])
    assert res.exit_code == 2 and "scope compression" in res.output
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(p), "--runner", "spark"])
    assert res.exit_code == 2 and "spark" in res.output
    # A budget the model's context cannot hold is refused before the first run, not after
    # the methods listed before it have run.
    res = CliRunner().invoke(app, ["eval", "--eval-set", str(p), "--methods", "bm25,select", "--target-tokens", "9000"])
    assert res.exit_code == 2 and "run select-9000: compression.target_tokens: got 9000" in res.output
    assert "rows" not in res.output  # nothing ran


def test_a_resumed_eval_id_names_the_runs_its_summary_leaves_out(tmp_path, capsys) -> None:
    """Reusing an eval id with fewer methods rewrote the summary without the others, unsaid."""
    from pipeline.eval.runner import _note_runs_left_out

    for tag in ("select-512", "bm25-512", "rag-105-eq-select-512"):
        (tmp_path / "e1" / "runs" / tag).mkdir(parents=True)
    _note_runs_left_out(tmp_path / "e1", {"bm25"})
    err = capsys.readouterr().err
    assert "also holds runs of rag-105-eq-select-512, select-512" in err and "--methods" in err
    _note_runs_left_out(tmp_path / "e1", {"bm25", "select", "rag"})
    assert capsys.readouterr().err == ""


def test_an_eval_set_without_styles_says_why_there_is_no_table_by_style(tmp_path):
    from pipeline.eval.runner import EvalResult, render_markdown

    summary = [{"method": "bm25", "target_tokens": 512, "task": "qa"}]
    plain = render_markdown(EvalResult("e1", tmp_path, summary, [], [], []))
    assert "No table by question style: the eval set's records have no `style` field" in plain
    styled = render_markdown(EvalResult("e1", tmp_path, summary, [], [], [],
                                         by_style=[{"method": "bm25", "target_tokens": 512, "echoed (n=1)": 1.0}]))
    assert "### contains by question style" in styled and "No table by question style" not in styled
    busy = render_markdown(EvalResult("e1", tmp_path, summary, [], [], [], busy="the load average (3.30) was high"))
    assert "**Note:** the load average (3.30) was high: the time columns are not a measurement" in busy
    assert "**Note:**" not in plain
