"""Build the QA eval set: long documents with inserted facts at set depths plus native questions.

Tooling for ``pipeline.corpus.build``. Contract of one record (a JSON line):

- ``id``: the corpus doc id; ``text``: the document with the inserted facts;
- ``questions``, ``answers``, ``depths``, ``kind``: parallel lists, one entry per question.
  ``answers`` are literal substrings of ``text``; ``depths`` is the character offset of
  the answer's evidence divided by ``len(text)`` (0 = start, 1 = end); ``kind`` is
  ``"inserted"`` for a synthetic fact or ``"native"`` for a question about the original
  text (its depth is the answer's first occurrence).

Facts are inserted as their own paragraph at a paragraph boundary between two prose
paragraphs (never inside code, lists or tables), the boundary nearest the target
depth. Which fact goes into which document is drawn with a fixed seed, so the output
is deterministic.
"""

from __future__ import annotations

import random

from pipeline.corpus.qa import NATIVE_QA, NEEDLES

SEED = 20240611
TARGET_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
NEEDLES_PER_DOC = 3
MAX_DEPTH_ERROR = 0.08  # an inserted fact lands within this of its target depth
# Eval documents: 4k-8k tokens, several times a 512-1024 token budget.
EVAL_DOCS = ("faq-general", "howto-sockets", "tutorial-errors", "tutorial-inputoutput",
             "whatsnew-3-1", "howto-urllib2", "tutorial-modules", "howto-argparse")


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
    """Insert each ``(sentence, target_depth)`` as a paragraph at the prose boundary nearest
    ``target_depth * len(text)``; return the new text and each sentence's start offset in it.

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


def build_eval_records(corpus: dict[str, str]) -> list[dict]:
    """One eval record per document of ``EVAL_DOCS`` (see the module docstring)."""
    rng = random.Random(SEED)
    needles = rng.sample(NEEDLES, NEEDLES_PER_DOC * len(EVAL_DOCS))
    records = []
    for d, doc_id in enumerate(EVAL_DOCS):
        mine = needles[d * NEEDLES_PER_DOC : (d + 1) * NEEDLES_PER_DOC]
        # Rotate through the target depths so each depth is used about equally often.
        targets = [TARGET_DEPTHS[(d + 2 * j) % len(TARGET_DEPTHS)] for j in range(len(mine))]
        text, starts = insert_facts(corpus[doc_id], [(s, t) for (s, _, _), t in
                                                     zip(mine, targets, strict=True)])
        questions, answers, depths, kinds = [], [], [], []
        for (sentence, question, answer), start in sorted(
                zip(mine, starts, strict=True), key=lambda p: p[1]):
            if text.count(answer) != 1:
                raise ValueError(f"inserted answer {answer!r} is not unique in {doc_id!r}")
            depth = (start + sentence.index(answer)) / len(text)
            target = targets[mine.index((sentence, question, answer))]
            if abs(depth - target) > MAX_DEPTH_ERROR:
                raise ValueError(f"{answer!r} landed at depth {depth:.3f} of {doc_id!r}, "
                                 f"target {target}")
            questions.append(question)
            answers.append(answer)
            depths.append(round(depth, 4))
            kinds.append("inserted")
        for question, answer in NATIVE_QA[doc_id]:
            if answer not in text:
                raise ValueError(f"native answer {answer!r} is not in the text of {doc_id!r}")
            questions.append(question)
            answers.append(answer)
            depths.append(round(text.index(answer) / len(text), 4))
            kinds.append("native")
        records.append({"id": doc_id, "text": text, "questions": questions,
                        "answers": answers, "depths": depths, "kind": kinds})
    return records
