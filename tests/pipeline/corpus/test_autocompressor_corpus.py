"""pipeline/corpus/autocompressor_corpus.py on a tiny reST tree: eval pages and ids are
excluded, the held-out pages split off, short pages skipped, the page list written."""

from __future__ import annotations

import json

from pipeline.corpus.autocompressor_corpus import HELDOUT, MIN_CHARS, main, page_id

PARAGRAPH = "The interpreter reads each statement in turn and runs it. " * 8


def _page(title: str, paragraphs: int) -> str:
    return f"{title}\n{'*' * len(title)}\n\n" + "\n\n".join([PARAGRAPH] * paragraphs) + "\n"


def test_pages_are_split_and_eval_pages_excluded(tmp_path):
    root, jobs = tmp_path / "_sources", tmp_path / "jobs"
    long_pages = {"library/ftplib.rst.txt": "Ftplib", "howto/annotations.rst.txt": "Annotations",
                  "howto/sorting.rst.txt": "Sorting",  # a page of the project corpus (build.SOURCES)
                  "library/zipapp.rst.txt": "Zipapp",  # its id is in an eval set below
                  "library/glob.rst.txt": "Glob"}  # its id names a jobs/corpus document
    for rel, title in long_pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(_page(title, 6))
    (root / "library" / "tiny.rst.txt").write_text(_page("Tiny", 1))  # under MIN_CHARS
    (jobs / "eval").mkdir(parents=True)
    (jobs / "corpus").mkdir()
    (jobs / "eval" / "x.jsonl").write_text(json.dumps({"id": "library-zipapp", "text": "..."}) + "\n")
    (jobs / "corpus" / "library-glob.txt").write_text("...")
    out, pages = tmp_path / "out", tmp_path / "pages.txt"

    counts = main(["--out", str(out), "--doc-root", str(root), "--jobs", str(jobs), "--pages", str(pages)])
    assert "howto-annotations" in HELDOUT and len(PARAGRAPH) * 6 > MIN_CHARS
    assert counts == {"train": 1, "heldout": 1}
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert [r["id"] for r in train] == ["library-ftplib"] and [r["id"] for r in heldout] == ["howto-annotations"]
    assert train[0]["text"].startswith("Ftplib") and "*" not in train[0]["text"]  # reST converted to text
    assert pages.read_text().splitlines() == ["heldout\thowto-annotations\thowto/annotations.rst.txt",
                                              "train\tlibrary-ftplib\tlibrary/ftplib.rst.txt"]


def test_page_ids_follow_the_corpus_convention():
    assert page_id("reference/simple_stmts.rst.txt") == "reference-simple-stmts"
    assert page_id("whatsnew/3.1.rst.txt") == "whatsnew-3-1"
