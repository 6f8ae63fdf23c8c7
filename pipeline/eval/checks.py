"""What is wrong with a QA eval set, said before any model loads.

Why: `longdoc eval` on a set with a misnamed ``answers`` field ran every method and printed
a table of dashes with exit code 0; a misspelt style label became a column of its own; an
answer that is not in its document silently left the recall's denominator. A researcher's
own held-out set is exactly where these happen.

Contract:
- ``check_eval_set(path) -> EvalSetCheck``: ``refusals`` (the set cannot be scored:
  `eval` exits 2 before any run) and ``notes`` (it can, but some figures will not mean what
  they seem: printed before the first run). Reads the file once, as JSON lines; a line that
  is not a JSON object is the run's to report as an error row, not this check's.
- Refused: a folder or a file that is not JSONL; no record with ``questions``; no record
  with ``answers`` (nothing could be scored).
- Noted, each with the first place it happens: fields this command does not read
  (``styles`` for ``style``); ``style``/``kind``/``depths`` lists of another length than
  ``questions``; style labels outside ``KNOWN_STYLES`` (a label of one's own is allowed:
  it gets its own column); questions without an answer (they count in ``n``, score in no
  accuracy figure); records repeating an earlier id; records whose answers do not pair
  with their questions, and questions
  that are not strings (the reader makes them error rows: stages/read.py; they score as
  wrong); answers that do not occur in their document (no evidence recall); and answers
  occurring more than once in a document without ``depths`` (their evidence is the first
  occurrence: pipeline/eval/recall.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from schemas.spec import InputSpec
from stages.record_fields import given_answers, pairing_problem, question_field_problem

#: The fields of an eval record (jobs/README.md, "Formats").
EVAL_FIELDS = ("id", "text", "questions", "answers", "depths", "kind", "style")
#: The question styles of the shipped eval sets (pipeline/corpus/eval_records.py).
KNOWN_STYLES = ("echoed", "paraphrased", "two_sentence")
PARALLEL = ("style", "kind", "depths")


@dataclass
class EvalSetCheck:
    """What ``check_eval_set`` found: ``refusals`` stop `eval` (exit 2), ``notes`` are printed."""

    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Tally:
    """How often one problem occurs, and where first."""

    count: int = 0
    first: str = ""

    def add(self, where: str) -> None:
        self.count += 1
        self.first = self.first or where


def _as_list(v) -> list:
    return [] if v is None else list(v) if isinstance(v, list) else [v]


def check_eval_set(path: str) -> EvalSetCheck:
    """See the module contract. ``path``: a local file or an fsspec URI."""
    import fsspec

    out = EvalSetCheck()
    if "://" not in path and Path(path).is_dir():
        out.refusals.append(f"--eval-set {path!r} is a folder; fix: give one JSONL file (one record per line: "
                            '{"id", "text", "questions", "answers"}; jobs/README.md, "Formats")')
        return out
    records, unread = 0, _Tally()
    with_q = with_a = 0
    extra: dict[str, _Tally] = {}
    lengths, styles = {name: _Tally() for name in PARALLEL}, {}
    no_answer, absent, repeated = _Tally(), _Tally(), _Tally()
    unpaired, not_text, twice = _Tally(), _Tally(), _Tally()
    seen_ids: dict[str, int] = {}
    fields = InputSpec(uri=path, format="jsonl", question_field="questions", answer_field="answers")
    with fsspec.open(path, "r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                unread.add(f"line {lineno}")
                continue
            if not isinstance(rec, dict):
                unread.add(f"line {lineno}")
                continue
            records += 1
            where = f"line {lineno}"
            for name in rec:
                if name not in EVAL_FIELDS:
                    extra.setdefault(name, _Tally()).add(where)
            qs, ans = _as_list(rec.get("questions")), rec.get("answers")
            with_q += bool(qs)
            with_a += ans is not None
            answers = given_answers(rec.get("questions"), ans)  # the reader's pairing (stages/record_fields.py)
            doc_id = str(rec.get("id"))
            if doc_id in seen_ids:
                twice.add(f"id {doc_id!r} at lines {seen_ids[doc_id]} and {lineno}")
            seen_ids.setdefault(doc_id, lineno)
            scored = range(len(qs))
            if question_field_problem(rec.get("questions"), "questions"):
                scored = range(0)  # no question to pair or score: its note is the question's (bad_q below)
            elif problem := pairing_problem(rec, fields):
                unpaired.add(f"{where}: {problem.split('; fix:')[0]}")
                scored = range(0)  # the record's questions are error rows: none of its answers is read
            bad_q = [i + 1 for i, q in enumerate(qs) if not isinstance(q, str) or not q.strip()]
            if bad_q:
                not_text.add(f"{where} question {bad_q[0]} ({json.dumps(qs[bad_q[0] - 1])[:40]})")
            for name in PARALLEL:
                v = rec.get(name)
                if isinstance(v, list) and len(v) != len(qs):
                    lengths[name].add(f"{where} ({len(v)} for {len(qs)} questions)")
            for label in _as_list(rec.get("style")):
                if isinstance(label, str) and label not in KNOWN_STYLES:
                    styles.setdefault(label, _Tally()).add(where)
            text = rec.get("text") if isinstance(rec.get("text"), str) else ""
            has_depths = isinstance(rec.get("depths"), list)
            for i in scored:
                a = answers[i] if i < len(answers) else None
                first = a[0] if isinstance(a, list) and a else a
                if first is None:
                    no_answer.add(f"{where} question {i + 1}")
                elif str(first) not in text:
                    absent.add(f"{where} question {i + 1} ({str(first)[:40]!r})")
                elif not has_depths and text.count(str(first)) > 1:
                    repeated.add(f"{where} question {i + 1} ({str(first)[:40]!r}, {text.count(str(first))} times)")
    if not records:
        out.refusals.append(f"--eval-set {path!r}: not one JSON record in it ({unread.first or 'empty'}); fix: an "
                            'eval set is JSONL, one {"id", "text", "questions", "answers"} object per line')
        return out
    if not with_q:
        out.refusals.append(f"--eval-set {path!r}: none of its {records} record(s) has 'questions'; fix: name the "
                            "field 'questions' (one question or a list)")
    if not with_a:
        have = ", ".join(sorted(extra)) or "none"
        out.refusals.append(f"--eval-set {path!r}: none of its {records} record(s) has 'answers', so nothing "
                            f"could be scored (fields it does not read: {have}); fix: name the field 'answers' "
                            "(one per question, in order)")
    if out.refusals:
        return out
    for name, t in extra.items():
        close = [f for f in EVAL_FIELDS if f.rstrip("s") == name.rstrip("s")]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.notes.append(f"field {name!r} is not read by eval{hint}: {t.count} record(s), first {t.first}")
    for name, t in lengths.items():
        if t.count:
            out.notes.append(f"{name!r} has another length than 'questions' in {t.count} record(s), first {t.first}: "
                             f"the questions past its end have no {name}")
    for label, t in styles.items():
        out.notes.append(f"style {label!r} is not one of {', '.join(KNOWN_STYLES)}: it gets a column of its own "
                         f"({t.count} question(s), first {t.first})")
    counted = (  # (tally, what it counts, first where: what it does to the figures, and the fix)
        (twice, "record(s) repeat an id of an earlier one", "the run names such a document in an error row; "
                "fix: one id per document"),
        (unpaired, "record(s) whose answers do not pair with their questions", "the run makes each of their "
                   "questions an error row, scored as wrong; fix: one answer per question, in order (null for a "
                   "question without one)"),
        (not_text, "record(s) with a question that is not a non-empty string", "the run makes the record's "
                   "questions error rows, scored as wrong; fix: 'questions' is a question or a list of questions"),
        (no_answer, "question(s) have no answer", "they count in n and in no accuracy figure"),
        (absent, "answer(s) do not occur in their document", "they have no evidence recall; an answer is a "
                 "literal piece of the text (list other wordings as alternatives after it)"),
        (repeated, "answer(s) occur more than once in their document and the record has no 'depths'",
         "evidence recall takes the first occurrence; give 'depths' (the answer's character offset / len(text)) "
         "to point at the right one"),
        (unread, "line(s) are not a JSON record", "their runs' rows are error rows"),
    )
    out.notes += [f"{t.count} {what} (first: {t.first}): {effect}" for t, what, effect in counted if t.count]
    return out
