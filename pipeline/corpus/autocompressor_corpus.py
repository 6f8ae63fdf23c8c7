"""Build the AutoCompressor training text from the Python 3.11 docs, minus every eval page.

Source: the reST sources of Debian 12's ``python3.11-doc`` package
(``apt-get install -y python3.11-doc``; /usr/share/doc/python3.11/html/_sources), licensed
under the PSF License Agreement (the docs' own "Copyright"/"History and License" pages).
Converted to text with ``pipeline.corpus.rst`` (the converter the project corpus uses).

Excluded: every page of ``pipeline.corpus.build.SOURCES`` (that is every document of
jobs/corpus and therefore of jobs/eval/qa-tuning.jsonl, which is built from it) and every id in
jobs/eval/*.jsonl, compared both by page id and by source path. A few further pages are held
out of training for the NLL check (``HELDOUT``). Pages shorter than ``MIN_CHARS`` are skipped.

Run from the repository root:
    .venv/bin/python -m pipeline.corpus.autocompressor_corpus --out out/ac-corpus
Writes ``<out>/train.jsonl`` and ``<out>/heldout.jsonl`` ({"id", "text"} per line) and
the page list ``--pages`` (default jobs/results/autocompressor/pages.txt, one
``split<TAB>id<TAB>source`` line per page used), and returns the page counts.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from pipeline.corpus.build import DOC_ROOT, SOURCES
from pipeline.corpus.rst import collect_labels, rst_to_text

PAGES = Path("jobs/results/autocompressor/pages.txt")
MIN_CHARS = 2_000
# Held out of training for the continuation-NLL check: prose pages, none in any eval set.
HELDOUT = (
    "howto-annotations",
    "tutorial-interpreter",
    "library-contextvars",
    "howto-isolating-extensions",
)


def page_id(rel: str) -> str:
    """Same convention as jobs/corpus: 'reference/simple_stmts.rst.txt' -> 'reference-simple-stmts'."""
    stem = rel.removesuffix(".rst.txt")
    return re.sub(r"-+", "-", re.sub(r"[/_.]", "-", stem)).strip("-")


def eval_ids(root: Path) -> set[str]:
    """Every record id (and its source-document id) in jobs/eval/*.jsonl and jobs/corpus."""
    ids = {p.stem for p in (root / "corpus").glob("*.txt")}
    for f in (root / "eval").glob("*.jsonl"):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                ids.update(str(rec[k]) for k in ("id", "doc_id", "source") if k in rec)
    return ids


def main(argv: list[str] | None = None) -> dict[str, int]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/ac-corpus"))
    ap.add_argument("--doc-root", type=Path, default=DOC_ROOT)
    ap.add_argument("--jobs", type=Path, default=Path("jobs"))
    ap.add_argument("--pages", type=Path, default=PAGES, help="where the list of pages used goes")
    args = ap.parse_args(argv)
    excluded_ids = set(SOURCES) | eval_ids(args.jobs)
    excluded_paths = set(SOURCES.values())
    pages = sorted(
        p.relative_to(args.doc_root).as_posix() for p in args.doc_root.rglob("*.rst.txt")
    )
    labels = collect_labels((args.doc_root / p).read_text("utf-8") for p in pages)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, listing = {"train": [], "heldout": []}, []
    for rel in pages:
        pid = page_id(rel)
        if pid in excluded_ids or rel in excluded_paths:
            continue
        text = rst_to_text((args.doc_root / rel).read_text("utf-8"), labels)
        if len(text) < MIN_CHARS:
            continue
        split = "heldout" if pid in HELDOUT else "train"
        rows[split].append({"id": pid, "text": text})
        listing.append(f"{split}\t{pid}\t{rel}")
    for split, recs in rows.items():
        with open(args.out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    args.pages.write_text("\n".join(listing) + "\n", encoding="utf-8")
    chars = {s: sum(len(r["text"]) for r in recs) for s, recs in rows.items()}
    print(
        f"train {len(rows['train'])} pages {chars['train']:,} chars; "
        f"heldout {len(rows['heldout'])} pages {chars['heldout']:,} chars; "
        f"excluded {len(excluded_ids)} ids -> {args.out}"
    )
    return {split: len(recs) for split, recs in rows.items()}


if __name__ == "__main__":
    main()
