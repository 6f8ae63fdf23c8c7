"""pipeline/studies/rag_chunk_recall.py on a tiny input: recall of the kept context per
chunk size and budget, and the chunks the embedder's window cuts."""

from __future__ import annotations

from pipeline.studies.rag_chunk_recall import main


def test_recall_by_chunk_size_on_a_tiny_set(qa_set, capsys):
    table = main(["--eval-set", str(qa_set), "--model", "random:tiny", "--budgets", "32,100000",
                  "--auto", "0.5", "--fixed", "24,600"])
    assert [r["chunk_tokens"] for r in table] == ["auto 0.5 of window", "fixed 24", "fixed 600"]
    for row in table:
        assert 0.0 <= row["recall"][32] <= 1.0
        assert row["recall"][100000] == 1.0  # a budget over the document keeps it whole
    auto, small, large = table
    assert auto["cut"] == 0 and small["cut"] == 0  # auto sizes chunks to fit the embedder
    assert large["cut"] == large["chunks"] > 0  # 600 tokens are over its 256-word-piece window
    assert small["mean_chunk"] <= 24 < auto["mean_chunk"]
    assert "| fixed 600 |" in capsys.readouterr().out
