"""Question styles of the eval sets: how much of its evidence a question repeats.

Why: a selector that follows the question's words finds an answer whose sentence
repeats them, and may miss one whose sentence says the same thing in other words.
The eval reports each style apart, so a method that only wins on echoed questions
shows it.

Contract:
- ``content_words(text)``: the set of stemmed content words of ``text``: lower case,
  split on anything but letters and digits, stop words dropped (``STOP_WORDS``:
  function words, question words, auxiliaries), each word cut by ``stem`` (a small
  suffix stripper, so "served" and "serve" meet).
- ``echo_share(question, evidence, answer)``: the share of the evidence sentence's
  content words, the answer's own words left out, that the question contains. 1.0:
  every cue of the sentence is in the question; 0.0: none is. An evidence sentence
  with no content word but the answer's shares 0.0.
- ``style_of(question, sentences, answer)``: ``"two_sentence"`` when the evidence is
  two or more sentences (the answer's sentence, the last, is read through an earlier
  one: on its own it must share <= ``PARAPHRASED_MAX`` with the question, else
  ValueError), otherwise ``"echoed"`` when ``echo_share`` >= ``ECHOED_MIN`` and ``"paraphrased"``
  when it is <= ``PARAPHRASED_MAX``; in between raises ValueError (a question meant
  for one style must clearly be of it). ``native_style`` labels a question about the
  original text by the same rule with one cut-off (``PARAPHRASED_MAX``), since its
  wording was not written to a style.
"""

from __future__ import annotations

import re

STYLES = ("echoed", "paraphrased", "two_sentence")
ECHOED_MIN = 0.5
PARAPHRASED_MAX = 0.25

STOP_WORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during
    before after above below to from up down in out on off over under again further then once
    here there when where why how what which who whom whose this that these those am is are was
    were be been being have has had having do does did doing would should could can will shall
    may might must i me my we our ours you your yours he him his she her hers it its they them
    their theirs as so than too very not no nor only own same such just also each every all
    any both few more most other some many much one get gets got kind""".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_SUFFIXES = ("ing", "ed", "es", "s", "e", "ly")


def stem(word: str) -> str:
    """Strip one common English suffix, keeping at least three letters."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    """Stemmed content words of ``text`` (see the module contract)."""
    return {stem(w) for w in _WORD.findall(text.lower()) if w not in STOP_WORDS}


def echo_share(question: str, evidence: str, answer: str) -> float:
    """Share of the evidence's content words (answer excluded) found in the question."""
    cues = content_words(evidence) - content_words(answer)
    if not cues:
        return 0.0
    return len(cues & content_words(question)) / len(cues)


def style_of(question: str, sentences: list[str] | tuple[str, ...], answer: str) -> str:
    """The style of a question over its evidence ``sentences`` (see the module contract)."""
    if not sentences:
        raise ValueError(f"question {question!r} has no evidence sentence")
    if len(sentences) > 1:
        alone = echo_share(question, sentences[-1], answer)
        if alone > PARAPHRASED_MAX:
            raise ValueError(
                f"two-sentence question {question!r} repeats {alone:.2f} of the answer's own "
                f"sentence {sentences[-1]!r} (at most {PARAPHRASED_MAX}): it needs only that one"
            )
        return "two_sentence"
    share = echo_share(question, sentences[0], answer)
    if share >= ECHOED_MIN:
        return "echoed"
    if share <= PARAPHRASED_MAX:
        return "paraphrased"
    raise ValueError(
        f"question {question!r} repeats {share:.2f} of its evidence {sentences[0]!r}: between "
        f"the paraphrased (<= {PARAPHRASED_MAX}) and echoed (>= {ECHOED_MIN}) styles"
    )


def native_style(question: str, evidence: str, answer: str) -> str:
    """echoed or paraphrased for a question about the original text (one cut-off)."""
    return "paraphrased" if echo_share(question, evidence, answer) <= PARAPHRASED_MAX else "echoed"
