"""Answer-accuracy metrics for the QA eval, with SQuAD-style normalisation.

Contract: every metric takes the generated text and one or more reference answers
and returns the best score over the references, in [0, 1].
- ``normalize_answer``: the SQuAD v1.1 evaluation rules (lower case, punctuation
  removed, English articles a/an/the removed, whitespace collapsed) on Unicode text:
  NFKC first (full-width "１８７５" is "1875", a decomposed "ä" the composed one),
  invisible format characters (zero-width spaces and joiners, soft hyphens) removed,
  every Unicode punctuation mark removed but a decimal point between digits ("15.5"
  is not "155"; "1,214" is "1214"). ``longdoc report`` scores by the same rules
  (pipeline/report/summary.py).
- ``exact_match``: 1.0 when the normalised texts are equal.
- ``contains``: 1.0 when the normalised reference occurs in the normalised
  prediction as a whole-word sequence (so "1" does not match "1990"). Small models
  answer in sentences; this is the figure that tolerates that.
- ``token_f1``: harmonic mean of token precision and recall on normalised
  bag-of-words overlap (SQuAD's F1).
A missing prediction (None, e.g. an error row) scores 0 on every metric.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_DECIMAL_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_KEPT_POINT = "\x00"  # stands for a decimal point while punctuation is removed


def normalize_answer(text: str) -> str:
    text = _DECIMAL_POINT.sub(_KEPT_POINT, unicodedata.normalize("NFKC", text).lower())
    text = "".join(c for c in text if not unicodedata.category(c).startswith(("P", "Cf")))
    text = _ARTICLES.sub(" ", text.replace(_KEPT_POINT, "."))
    return " ".join(text.split())


def _refs(references: str | Sequence[str]) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("at least one reference answer is needed to score a prediction")
    return refs


def _exact(pred: str, ref: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(ref))


def _contains(pred: str, ref: str) -> float:
    p, r = normalize_answer(pred).split(), normalize_answer(ref).split()
    if not r:  # reference normalises to nothing (e.g. "The"): fall back to equality
        return float(not p)
    return float(any(p[i : i + len(r)] == r for i in range(len(p) - len(r) + 1)))


def _f1(pred: str, ref: str) -> float:
    p, r = normalize_answer(pred).split(), normalize_answer(ref).split()
    if not p or not r:
        return float(p == r)
    same = sum((Counter(p) & Counter(r)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(r)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str | None, references: str | Sequence[str]) -> float:
    refs = _refs(references)
    return 0.0 if prediction is None else max(_exact(prediction, r) for r in refs)


def contains(prediction: str | None, references: str | Sequence[str]) -> float:
    refs = _refs(references)
    return 0.0 if prediction is None else max(_contains(prediction, r) for r in refs)


def token_f1(prediction: str | None, references: str | Sequence[str]) -> float:
    refs = _refs(references)
    return 0.0 if prediction is None else max(_f1(prediction, r) for r in refs)


METRICS = {"exact_match": exact_match, "contains": contains, "f1": token_f1}


def score(prediction: str | None, references: str | Sequence[str]) -> dict[str, float]:
    """All metrics for one prediction: ``{"exact_match", "contains", "f1"}``."""
    return {name: fn(prediction, references) for name, fn in METRICS.items()}
