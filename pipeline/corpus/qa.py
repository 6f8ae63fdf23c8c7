"""The questions of the sample QA job and the eval set, read from ``questions.json``.

Questions are data, not code: ``questions.json`` beside this module holds
- ``sample_qa``: doc id -> [{question, answer}] for the sample QA job (2k-4k-token documents);
- ``native_qa``: doc id -> [{question, answer}] answerable only from an eval document's text;
- ``needles``: [{sentence, question, answer}], invented facts inserted into the tuning part
  of the eval, each question echoing its sentence (no model can know them; each answer is
  distinctive and absent from the corpus);
- ``facts``: part (tuning, report, heldout) -> question style (pipeline.corpus.styles) ->
  [{sentences, question, answer}], further invented facts, the answer in the last sentence.
Every answer is a literal substring of the text ``pipeline.corpus.rst`` produces (the build
re-checks this). Order is kept: the eval build samples needles by position with a fixed seed.
Read by ``pipeline.corpus.build`` and ``pipeline.corpus.eval_records`` only.
"""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS_FILE = Path(__file__).with_name("questions.json")


def _pairs(section: dict[str, list[dict[str, str]]]) -> dict[str, list[tuple[str, str]]]:
    return {doc: [(p["question"], p["answer"]) for p in pairs] for doc, pairs in section.items()}


_DATA = json.loads(QUESTIONS_FILE.read_text(encoding="utf-8"))
#: doc id -> [(question, answer)]: the sample QA job.
SAMPLE_QA: dict[str, list[tuple[str, str]]] = _pairs(_DATA["sample_qa"])
#: doc id -> [(question, answer)] answerable only from the original text of an eval document.
NATIVE_QA: dict[str, list[tuple[str, str]]] = _pairs(_DATA["native_qa"])
#: (sentence, question, answer) facts inserted into the eval documents.
NEEDLES: list[tuple[str, str, str]] = [
    (n["sentence"], n["question"], n["answer"]) for n in _DATA["needles"]
]
#: part -> style -> [(sentences, question, answer)]: the further facts of each eval part.
FACTS: dict[str, dict[str, list[tuple[tuple[str, ...], str, str]]]] = {
    part: {
        style: [(tuple(f["sentences"]), f["question"], f["answer"]) for f in facts]
        for style, facts in styles.items()
    }
    for part, styles in _DATA["facts"].items()
}
