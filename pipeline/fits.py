"""What the first documents will meet, counted in the generating model's tokens before any
model loads: a method that prefills documents whole (``none``) and the model's context,
``truncate``'s budget, ``input.max_doc_tokens``.

Why: each of these turns into something a user finds only after the night: ``none`` makes a
document longer than the context an error row in the generate stage, after the model
loaded and the other rows ran (a summaries night of long reports: 9 of 12 rows failed after
2 min 46 s); ``truncate`` summarizes a 63,000-token report from its first and last 512
tokens and says nothing; a document over ``max_doc_tokens`` is an error row. ``validate``
and ``run`` count the first documents instead, with the tokenizer's files (the
``tokenizers`` library: no model, no torch; stages/context_budget.py).

Contract: ``first_fit(spec, run_date) -> Fit | None``: None when nothing can be counted here
(a context or tokenizer not on this machine, an input not listable here or needing a date,
no readable document among the first). ``Fit.refusal()``: one line when the method prefills
whole documents and every one of the first is longer than the context (the corpus likely
is; it names the first, its tokens and the methods that fit). ``Fit.note()``: the words
``validate`` adds for the rest: documents too long for ``none`` or over
``input.max_doc_tokens`` (error rows), and documents ``truncate`` shows only in part
(with the share of the longest and the largest budget that fits). The stages' own checks
stay the guard for the documents after the first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from schemas.spec import JobSpec

log = logging.getLogger("longdoc")

if TYPE_CHECKING:
    from stages.read import Document

#: How many documents are counted: as many records as the preflight reads (pipeline/preflight.py).
FIRST_DOCUMENTS = 20


@dataclass(frozen=True)
class Fit:
    """The first documents' token counts against the spec's limits (module contract).
    ``tokens``: (document, its tokens) per counted document; ``frame``: the prompt's own
    tokens around a document; ``whole``: the method prefills documents whole."""

    spec: JobSpec
    context: int
    frame: int
    tokens: tuple[tuple[str, int], ...]
    whole: bool

    @property
    def _room(self) -> int:
        """Document tokens the context holds beside the frame and the answer."""
        return self.context - self.frame - self.spec.generation.max_new_tokens

    def _too_long(self) -> list[tuple[str, int]]:
        return [(name, n + self.frame) for name, n in self.tokens if self.whole and n > self._room]

    def _first(self) -> str:
        """The first too-long document's error, as the tokenize stage will write it."""
        from stages.context_budget import over_context

        name, need = self._too_long()[0]
        return over_context(name, need, self.spec.generation.max_new_tokens, self.context) or ""

    def refusal(self) -> str | None:
        long = self._too_long()
        if not long or len(long) < len(self.tokens):
            return None
        return (f"compression.method: {self.spec.compression.method!r} reads each document whole, and all "
                f"of the first {len(self.tokens)} document(s) are longer than the model's context; the "
                f"first: {self._first()} (or shorter documents)")

    def note(self) -> str:
        n, parts = len(self.tokens), []
        long = self._too_long()
        if long and not self.refusal():
            parts.append(f"{len(long)} of the first {n} document(s) are too long for method "
                         f"{self.spec.compression.method!r} and will be error rows; the first: {self._first()}")
        cap = self.spec.input.max_doc_tokens
        over = [(name, t) for name, t in self.tokens if t > cap]
        if over:
            parts.append(f"{len(over)} of the first {n} document(s) are over input.max_doc_tokens {cap} and "
                         f"will be error rows (the first: {over[0][0]!r}, {over[0][1]} tokens)")
        from stages.compression import method_for

        by_position = method_for(self.spec.compression).keeps_by_position
        budget = self.spec.compression.budget_tokens if by_position else None
        cut = sorted(((t, name) for name, t in self.tokens if budget and cap >= t > budget), reverse=True)
        if cut:
            longest, name = cut[0]
            keep = getattr(self.spec.compression, "keep", None)
            parts.append(f"{self.spec.compression.method} shows the model {budget} tokens of {len(cut)} of the "
                         f"first {n} document(s) ({f'keep {keep}: ' if keep else ''}{100 * budget / longest:.1f}% "
                         f"of the longest, {name!r}, {longest} tokens); compression.target_tokens up to "
                         f"{self._room} fits the context, and finch or select read every token")
        elif budget:
            # Said too when nothing is cut: silence read as the check not having run.
            shown = sorted(((t, name) for name, t in self.tokens if cap >= t), reverse=True)
            if shown:
                # Of the documents it reads: those over input.max_doc_tokens are error rows (said above).
                but = "" if len(shown) == n else f" but the {n - len(shown)} over input.max_doc_tokens"
                parts.append(f"{self.spec.compression.method} shows the model every token of the "
                             f"first {n} document(s){but}: the longest, {shown[0][1]!r}, {shown[0][0]} tokens, is within "
                             f"compression.target_tokens {budget}")
        return "".join(f" ({p})" for p in parts)


def first_fit(spec: JobSpec, run_date: str | None) -> Fit | None:
    """The first documents of ``spec``'s input, counted (module contract)."""
    from stages.compression import method_for
    from stages.context_budget import frame_tokens_from_files, model_context, tokenizer_files

    if "{run_date}" in spec.input.uri and run_date is None:
        return None
    method = method_for(spec.compression)
    context = model_context(spec.generation.model)
    try:
        source = method.tokenizer_source(spec)
    except ValueError:  # a checkpoint that cannot serve: the preflight's to say (its method's problems)
        return None
    files = tokenizer_files(source)
    if context is None or files is None:
        return None
    try:
        texts = _first_texts(spec, run_date or "")
        if not texts:
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(files / "tokenizer.json"))
        question = max(spec.task.questions, key=len, default=None)
        frame = frame_tokens_from_files(files, spec.task.resolved_instruction, question)
        counts = [len(e.ids) for e in tok.encode_batch([t for _, t in texts], add_special_tokens=False)]
    except Exception:  # noqa: BLE001 - storage: the preflight's to say; an odd template: the stages'
        log.debug("validate's fit check skipped", exc_info=True)  # advice only: never a refusal
        return None
    return Fit(spec, context, frame, tuple((name, n) for (name, _), n in zip(texts, counts, strict=True)),
               prefills_whole(spec))


def prefills_whole(spec: JobSpec) -> bool:
    """The spec's method prefills each document whole (``none``): its documents must fit."""
    from stages.compression import method_for

    return method_for(spec.compression).prefills_whole(spec)


def first_documents(spec: JobSpec, run_date: str, shards: list[str] | None = None) -> list[Document]:
    """The first ``FIRST_DOCUMENTS`` documents as the read stage reads them (error documents
    included: a bad line, an empty file), over as many files as it takes (``shards``: the
    input's listing when the caller has it, else listed here)."""
    from stages.listing import list_shards, resolve_uri
    from stages.read import iter_shard

    root = resolve_uri(spec.input.uri, run_date)
    out: list[Document] = []
    for shard in (shards if shards is not None else list_shards(spec.input, run_date))[:FIRST_DOCUMENTS]:
        out += islice(iter_shard(shard, spec.input, root), FIRST_DOCUMENTS - len(out))
        if len(out) >= FIRST_DOCUMENTS:
            break
    return out


def _first_texts(spec: JobSpec, run_date: str) -> list[tuple[str, str]]:
    """(document id, text) of the first readable documents."""
    return [(d.doc_id, d.text) for d in first_documents(spec, run_date) if d.error is None and d.text]
