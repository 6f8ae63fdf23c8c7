"""Rebuild the sample corpus, the sample QA file and the eval sets under ``jobs/``.

Tooling, not runtime: ``python -m pipeline.corpus.build --out jobs`` reads the reST
sources that Debian's ``python3.11-doc`` package installs (``apt-get install -y
python3.11-doc``), converts the pages listed in ``SOURCES`` to plain text
(``pipeline.corpus.rst``) and writes

- ``<out>/corpus/<doc_id>.txt``: one document per file;
- ``<out>/sample-qa.jsonl``: hand-written questions for a few short documents
  (``pipeline.corpus.qa.SAMPLE_QA``);
- ``<out>/eval/<part file>``: for each part of the eval (tuning, report, held-out
  paraphrased: ``pipeline.corpus.eval_records.PARTS``), longer documents with inserted
  facts at set depths plus native questions, each question labelled with its style.

``--from-corpus`` skips the reST step and builds the QA files from the committed
``<out>/corpus/`` (no Debian package needed: how the questions are edited).

The output is deterministic: same Debian package, same bytes. Every answer is checked
to be a literal substring of its text, and every document's length in tokens of the
embedded tokenizer is checked against ``TOKEN_RANGE``; a mismatch raises ValueError
instead of writing data that silently disagrees with its questions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.corpus.eval_records import PARTS, build_part
from pipeline.corpus.qa import SAMPLE_QA
from pipeline.corpus.rst import collect_labels, rst_to_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DOC_ROOT = Path("/usr/share/doc/python3.11/html/_sources")
TOKENIZER = "embedded:smollm2-135m-instruct"
TOKEN_RANGE = (2_000, 20_000)  # inclusive bounds on a corpus document's token count
SAMPLE_TOKENS = (2_000, 6_000)  # sample QA documents stay short so the sample job is quick
EVAL_TOKENS = (4_000, 8_000)  # eval documents: several times a 512-1024 token budget

# doc id -> reST source path under DOC_ROOT. Prose pages first: HOWTOs, the tutorial,
# the FAQ, the language reference, What's New, and a few narrative library pages.
SOURCES: dict[str, str] = {
    "howto-sorting": "howto/sorting.rst.txt",
    "howto-ipaddress": "howto/ipaddress.rst.txt",
    "howto-sockets": "howto/sockets.rst.txt",
    "howto-instrumentation": "howto/instrumentation.rst.txt",
    "howto-pyporting": "howto/pyporting.rst.txt",
    "howto-curses": "howto/curses.rst.txt",
    "howto-urllib2": "howto/urllib2.rst.txt",
    "howto-argparse": "howto/argparse.rst.txt",
    "howto-unicode": "howto/unicode.rst.txt",
    "howto-logging": "howto/logging.rst.txt",
    "howto-enum": "howto/enum.rst.txt",
    "howto-descriptor": "howto/descriptor.rst.txt",
    "howto-functional": "howto/functional.rst.txt",
    "howto-regex": "howto/regex.rst.txt",
    "tutorial-stdlib": "tutorial/stdlib.rst.txt",
    "tutorial-floatingpoint": "tutorial/floatingpoint.rst.txt",
    "tutorial-stdlib2": "tutorial/stdlib2.rst.txt",
    "tutorial-errors": "tutorial/errors.rst.txt",
    "tutorial-inputoutput": "tutorial/inputoutput.rst.txt",
    "tutorial-modules": "tutorial/modules.rst.txt",
    "tutorial-datastructures": "tutorial/datastructures.rst.txt",
    "tutorial-classes": "tutorial/classes.rst.txt",
    "tutorial-controlflow": "tutorial/controlflow.rst.txt",
    "faq-windows": "faq/windows.rst.txt",
    "faq-general": "faq/general.rst.txt",
    "faq-library": "faq/library.rst.txt",
    "faq-design": "faq/design.rst.txt",
    "faq-programming": "faq/programming.rst.txt",
    "reference-executionmodel": "reference/executionmodel.rst.txt",
    "reference-simple-stmts": "reference/simple_stmts.rst.txt",
    "reference-lexical-analysis": "reference/lexical_analysis.rst.txt",
    "reference-import": "reference/import.rst.txt",
    "reference-compound-stmts": "reference/compound_stmts.rst.txt",
    "whatsnew-3-0": "whatsnew/3.0.rst.txt",
    "whatsnew-3-1": "whatsnew/3.1.rst.txt",
    "library-main": "library/__main__.rst.txt",
    "library-venv": "library/venv.rst.txt",
    "library-json": "library/json.rst.txt",
    "library-dataclasses": "library/dataclasses.rst.txt",
}


def build_corpus(doc_root: Path = DOC_ROOT) -> dict[str, str]:
    """Doc id -> plain text for every entry of ``SOURCES`` (labels resolved across all pages)."""
    if not doc_root.is_dir():
        raise ValueError(
            f"doc_root {str(doc_root)!r} is not a directory; install the sources with "
            "`apt-get install -y python3.11-doc` or pass --doc-root"
        )
    labels = collect_labels(p.read_text("utf-8") for p in sorted(doc_root.rglob("*.rst.txt")))
    return {doc_id: rst_to_text((doc_root / rel).read_text("utf-8"), labels)
            for doc_id, rel in SOURCES.items()}


def check_answers(doc_id: str, text: str, answers: list[str]) -> None:
    """Raise ValueError when an answer is not a literal substring of its document."""
    missing = [a for a in answers if a not in text]
    if missing:
        raise ValueError(f"answers {missing!r} are not in the text of {doc_id!r}")


def sample_qa_records(corpus: dict[str, str]) -> list[dict]:
    """One ``{id, text, questions, answers}`` record per document in ``SAMPLE_QA``."""
    records = []
    for doc_id, pairs in SAMPLE_QA.items():
        questions, answers = [q for q, _ in pairs], [a for _, a in pairs]
        check_answers(doc_id, corpus[doc_id], answers)
        records.append({"id": doc_id, "text": corpus[doc_id], "questions": questions,
                        "answers": answers})
    return records


def _check_lengths(tok: PreTrainedTokenizerBase, records: list[dict], bounds: tuple[int, int], what: str) -> None:
    sizes = {r["id"]: len(tok(r["text"], add_special_tokens=False).input_ids) for r in records}
    bad = {d: n for d, n in sizes.items() if not bounds[0] <= n <= bounds[1]}
    if bad:
        raise ValueError(f"{what} documents outside {bounds} tokens: {bad}")


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_corpus(corpus_dir: Path) -> dict[str, str]:
    """Doc id -> text of the committed corpus files (``<doc_id>.txt``)."""
    texts = {p.stem: p.read_text("utf-8") for p in sorted(corpus_dir.glob("*.txt"))}
    missing = sorted(set(SOURCES) - set(texts))
    if missing:
        raise ValueError(f"corpus folder {str(corpus_dir)!r} lacks {missing}; rebuild it without --from-corpus")
    return texts


def write_all(out: Path, doc_root: Path = DOC_ROOT, from_corpus: bool = False) -> dict[str, int]:
    """Write corpus (unless ``from_corpus``), sample QA and the eval parts under ``out``;
    return doc id -> token count."""
    from stages.model_loading import load_tokenizer

    tok = load_tokenizer(TOKENIZER)
    corpus = read_corpus(out / "corpus") if from_corpus else build_corpus(doc_root)
    counts = {d: len(tok(t, add_special_tokens=False).input_ids) for d, t in corpus.items()}
    bad = {d: n for d, n in counts.items() if not TOKEN_RANGE[0] <= n <= TOKEN_RANGE[1]}
    if bad:
        raise ValueError(f"documents outside {TOKEN_RANGE} tokens: {bad}")
    if not from_corpus:
        corpus_dir = out / "corpus"
        corpus_dir.mkdir(parents=True, exist_ok=True)
        for stale in corpus_dir.glob("*.txt"):
            if stale.stem not in corpus:
                stale.unlink()
        for doc_id, text in corpus.items():
            (corpus_dir / f"{doc_id}.txt").write_text(text, encoding="utf-8")
    sample = sample_qa_records(corpus)
    parts = {part.file: build_part(corpus, part) for part in PARTS.values()}
    _check_lengths(tok, sample, SAMPLE_TOKENS, "sample QA")
    for file, records in parts.items():
        _check_lengths(tok, records, EVAL_TOKENS, f"eval ({file})")
    _write_jsonl(out / "sample-qa.jsonl", sample)
    for file, records in parts.items():
        _write_jsonl(out / "eval" / file, records)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("jobs"), help="output folder")
    parser.add_argument("--doc-root", type=Path, default=DOC_ROOT,
                        help="folder of the Python docs' reST sources (*.rst.txt)")
    parser.add_argument("--from-corpus", action="store_true",
                        help="build the QA files from the committed <out>/corpus/ (no reST sources needed)")
    args = parser.parse_args(argv)
    counts = write_all(args.out, args.doc_root, args.from_corpus)
    total = sum(counts.values())
    print(f"{len(counts)} documents, {min(counts.values())}-{max(counts.values())} tokens, "
          f"{total} in total -> {args.out}")


if __name__ == "__main__":
    main()
