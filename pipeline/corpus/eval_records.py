"""Build the QA eval sets: long documents with inserted facts at set depths plus native questions.

Tooling for ``pipeline.corpus.build``. The eval comes in parts (``PARTS``), each its own
file under ``jobs/eval/`` and its own documents:

- ``tuning`` (qa-tuning.jsonl): the documents defaults are chosen on;
- ``report`` (qa-report.jsonl): other documents, the same mix of questions, for the
  figures a change reports (nothing is tuned on it);
- ``heldout-paraphrased`` (qa-heldout-paraphrased.jsonl): further paraphrased facts in
  further documents (each cut to its first ``max_chars`` characters at a paragraph
  boundary), a check that no tuning ever reads.

Contract of one record (a JSON line):

- ``id``: the corpus doc id; ``text``: the document with the inserted facts;
- ``questions``, ``answers``, ``depths``, ``kind``, ``style``: parallel lists, one entry per
  question. ``answers`` are literal substrings of ``text``; ``depths`` is the character
  offset of the answer divided by ``len(text)`` (0 = start, 1 = end); ``kind`` is
  ``"inserted"`` for a synthetic fact or ``"native"`` for a question about the original
  text (its depth is the answer's first occurrence); ``style`` is the question's style
  (pipeline.corpus.styles): checked against the fact's evidence for inserted facts,
  measured against the sentence around the answer for native questions.

Facts are inserted as their own paragraph (one or two sentences) at a paragraph
boundary between two prose paragraphs (never inside code, lists or tables), the
boundary nearest the target depth: fact i of document d targets
``TARGET_DEPTHS[(d + 4 i) % 9]`` (up to nine facts per document at distinct depths). The tuning part's echoed facts are drawn from
``NEEDLES`` with a fixed seed; every other fact is handed out in order, so the output
is deterministic.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from pipeline.corpus.qa import FACTS, NATIVE_QA, NEEDLES
from pipeline.corpus.styles import STYLES, native_style, style_of

SEED = 20240611
TARGET_DEPTHS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
DEPTH_STEP = 4  # coprime with len(TARGET_DEPTHS): a document's facts get distinct depths
MAX_DEPTH_ERROR = 0.08  # an inserted fact lands within this of its target depth
NEEDLES_PER_DOC = 3  # echoed facts per tuning document, drawn from NEEDLES

Fact = tuple[tuple[str, ...], str, str]  # (sentences, question, answer in the last sentence)


@dataclass(frozen=True)
class EvalPart:
    """One part of the eval: its file under jobs/eval/, its documents, how many facts of
    each style every document gets, whether its native questions are asked, and the cut
    of its documents (characters; None = whole)."""

    name: str
    file: str
    docs: tuple[str, ...]
    per_doc: dict[str, int]
    native: bool = True
    max_chars: int | None = None


# Eval documents: 4k-8k tokens, several times a 512-1024 token budget.
PARTS: dict[str, EvalPart] = {
    p.name: p
    for p in (
        EvalPart(
            "tuning", "qa-tuning.jsonl",
            ("faq-general", "howto-sockets", "tutorial-errors", "tutorial-inputoutput",
             "whatsnew-3-1", "howto-urllib2", "tutorial-modules", "howto-argparse"),
            {"echoed": NEEDLES_PER_DOC, "paraphrased": 3, "two_sentence": 2},
        ),
        EvalPart(
            "report", "qa-report.jsonl",
            ("howto-instrumentation", "howto-pyporting", "howto-curses", "faq-design",
             "faq-library", "library-json", "tutorial-datastructures", "reference-simple-stmts"),
            {"echoed": 3, "paraphrased": 3, "two_sentence": 2},
        ),
        EvalPart(
            "heldout-paraphrased", "qa-heldout-paraphrased.jsonl",
            ("howto-unicode", "tutorial-classes", "reference-lexical-analysis", "whatsnew-3-0",
             "tutorial-controlflow", "howto-logging", "howto-functional", "reference-import"),
            {"paraphrased": 3},
            native=False,
            max_chars=24_000,
        ),
    )
}
_FACT_SOURCE = {"tuning": "tuning", "report": "report", "heldout-paraphrased": "heldout"}


def prose_boundaries(text: str) -> list[int]:
    """Character offsets of blank-line boundaries where a new top-level paragraph starts.

    A boundary qualifies when the next paragraph starts in column 0 (not code, not the
    indented continuation of a list item), neither side is a table row, and the previous
    paragraph does not end with ':' (a lead-in to the code or list that follows).
    """
    paragraphs = text.split("\n\n")
    offsets, pos = [], 0
    for k, (before, after) in enumerate(zip(paragraphs, paragraphs[1:], strict=False)):
        pos += len(before) + 2  # offset where paragraph k + 1 starts
        if (k > 0 and after[:1].strip() and not before.rstrip().endswith(":")
                and " | " not in before.rsplit("\n", 1)[-1] and " | " not in after[:200]):
            offsets.append(pos)
    return offsets


def insert_facts(text: str, facts: list[tuple[str, float]]) -> tuple[str, list[int]]:
    """Insert each ``(paragraph, target_depth)`` at the prose boundary nearest
    ``target_depth * len(text)``; return the new text and each paragraph's start offset in it.

    Raises ValueError when the text has fewer free prose boundaries than facts.
    """
    free = prose_boundaries(text)
    chosen: list[tuple[int, int]] = []  # (boundary offset in the original text, fact index)
    for i, (_, depth) in enumerate(facts):
        if not free:
            raise ValueError(f"not enough prose paragraph boundaries for {len(facts)} facts")
        best = min(free, key=lambda off: abs(off - depth * len(text)))
        free.remove(best)
        chosen.append((best, i))
    out, starts, last = [], [0] * len(facts), 0
    for off, i in sorted(chosen):
        out.append(text[last:off])
        starts[i] = sum(len(p) for p in out)
        out.append(facts[i][0] + "\n\n")
        last = off
    out.append(text[last:])
    return "".join(out), starts


def head_paragraphs(text: str, max_chars: int) -> str:
    """The whole paragraphs of ``text`` that fit in its first ``max_chars`` characters
    (ending with one newline, like a corpus document)."""
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n\n", 0, max_chars)
    if cut <= 0:
        raise ValueError(f"no paragraph boundary in the first {max_chars} characters")
    return text[:cut] + "\n"


def sentence_span(text: str, index: int) -> tuple[int, int]:
    """Character span ``[start, end)`` of the sentence of ``text`` holding character
    ``index``: from the previous sentence end (``.``, ``!`` or ``?`` then whitespace) or
    paragraph break to the next, surrounding whitespace excluded."""
    ends = list(re.finditer(r"[.!?]\s|\n\n", text))
    start = max((m.end() for m in ends if m.end() <= index), default=0)
    end = min((m.start() + 1 for m in ends if m.start() >= index), default=len(text))
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def sentence_around(text: str, index: int) -> str:
    """The sentence of ``text`` holding character ``index`` (``sentence_span``)."""
    start, end = sentence_span(text, index)
    return text[start:end]


def part_facts(part: EvalPart) -> list[list[tuple[str, Fact]]]:
    """Per document of ``part``, its inserted facts as (style, fact), in insertion order."""
    source = FACTS.get(_FACT_SOURCE[part.name], {})
    pools: dict[str, list[Fact]] = {s: list(source.get(s, [])) for s in STYLES}
    if part.name == "tuning":  # the echoed needles, drawn as the first eval set drew them
        rng = random.Random(SEED)
        drawn = rng.sample(NEEDLES, NEEDLES_PER_DOC * len(part.docs))
        pools["echoed"] = [((s,), q, a) for s, q, a in drawn]
    out: list[list[tuple[str, Fact]]] = []
    for d in range(len(part.docs)):
        mine = []
        for style in STYLES:
            n = part.per_doc.get(style, 0)
            pool = pools[style][d * n : (d + 1) * n]
            if len(pool) < n:
                raise ValueError(f"part {part.name}: {n} {style} facts per document, "
                                 f"{len(pools[style])} written for {len(part.docs)} documents")
            mine += [(style, f) for f in pool]
        out.append(mine)
    return out


def build_part(corpus: dict[str, str], part: EvalPart) -> list[dict]:
    """One eval record per document of ``part`` (see the module docstring). Raises ValueError
    when a fact is not of its style, an answer is not unique or not in the text, or a fact
    lands off its depth."""
    records = []
    for d, (doc_id, facts) in enumerate(zip(part.docs, part_facts(part), strict=True)):
        original = corpus[doc_id]
        if part.max_chars is not None:
            original = head_paragraphs(original, part.max_chars)
        targets = [TARGET_DEPTHS[(d + DEPTH_STEP * i) % len(TARGET_DEPTHS)] for i in range(len(facts))]
        paragraphs = [" ".join(sentences) for _, (sentences, _, _) in facts]
        text, starts = insert_facts(original, list(zip(paragraphs, targets, strict=True)))
        rows = []
        for (style, (sentences, question, answer)), para, start, target in zip(
                facts, paragraphs, starts, targets, strict=True):
            got = style_of(question, sentences, answer)
            if got != style:
                raise ValueError(f"{doc_id}: question {question!r} is {got}, written as {style}")
            if answer in original or text.count(answer) != 1:
                raise ValueError(f"inserted answer {answer!r} is not unique in {doc_id!r}")
            depth = (start + para.index(answer)) / len(text)
            if abs(depth - target) > MAX_DEPTH_ERROR:
                raise ValueError(f"{answer!r} landed at depth {depth:.3f} of {doc_id!r}, target {target}")
            rows.append((start, question, answer, round(depth, 4), "inserted", style))
        rows.sort(key=lambda r: r[0])
        for question, answer in NATIVE_QA[doc_id] if part.native else []:
            if answer not in text:
                raise ValueError(f"native answer {answer!r} is not in the text of {doc_id!r}")
            at = text.index(answer)
            style = native_style(question, sentence_around(text, at), answer)
            rows.append((at, question, answer, round(at / len(text), 4), "native", style))
        records.append({
            "id": doc_id,
            "text": text,
            "questions": [r[1] for r in rows],
            "answers": [r[2] for r in rows],
            "depths": [r[3] for r in rows],
            "kind": [r[4] for r in rows],
            "style": [r[5] for r in rows],
        })
    return records
