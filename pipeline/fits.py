"""Whether the first documents fit the model's context, for a method that prefills each
document whole (``none``), before any model loads.

Why: such a method makes a document longer than the context an error row, but only in
the generate stage, after the model loaded and the other rows ran (a summaries night of
long reports under ``none``: 9 of 12 rows failed after 2 min 46 s). ``validate`` and
``run`` count the first documents' tokens instead, with the generating model's tokenizer
files (the ``tokenizers`` library, no model and no torch: stages/context_budget.py).

Contract: ``first_fit(spec, run_date) -> Fit | None``: None when nothing is checked (a
method with a budget or one that reads any length, a context or tokenizer not on this
machine, an input not listable here or needing a date). ``Fit.refusal()``: one line when
every one of the first documents is too long (the whole corpus likely is; the line names
the first, its tokens and the methods that fit); ``Fit.note()``: the words for
``validate`` when only some are (they become error rows naming the document). The
stage's own check (stages/generate.py ``_precheck``) stays the guard for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from schemas.spec import JobSpec

#: How many documents are counted: as many as the preflight reads (pipeline/preflight.py).
FIRST_DOCUMENTS = 20


@dataclass(frozen=True)
class Fit:
    """The first documents against the context: ``long`` (document, prompt tokens) over it."""

    method: str
    context: int
    max_new_tokens: int
    counted: int
    long: tuple[tuple[str, int], ...]

    def _first(self) -> str:
        name, need = self.long[0]
        return (f"{name!r} needs {need} prompt tokens + {self.max_new_tokens} new tokens, more than the "
                f"model's context of {self.context}")

    def refusal(self) -> str | None:
        if not self.long or len(self.long) < self.counted:
            return None
        from stages.compression import budgeted_names

        *most, last = budgeted_names()
        return (f"compression.method: {self.method!r} reads each document whole, and all of the first "
                f"{self.counted} document(s) are longer than the model's context ({self._first()}); fix: "
                f"compression.method {', '.join(most)} or {last} (or shorter documents)")

    def note(self) -> str:
        if not self.long or self.refusal():
            return ""
        return (f" ({len(self.long)} of the first {self.counted} document(s) are too long for method "
                f"{self.method!r} and will be error rows; the first: {self._first()})")


def first_fit(spec: JobSpec, run_date: str | None) -> Fit | None:
    """The first documents of ``spec``'s input against its model's context (module contract)."""
    from stages.compression import method_for
    from stages.context_budget import frame_tokens_from_files, model_context, tokenizer_files

    method = method_for(spec.compression)
    if method.reads_any_length or method.budgets(spec) or method.runs_at != "prefill":
        return None
    if "{run_date}" in spec.input.uri and run_date is None:
        return None
    context = model_context(spec.generation.model)
    files = tokenizer_files(method.tokenizer_source(spec))
    if context is None or files is None:
        return None
    try:
        texts = _first_texts(spec, run_date or "")
    except Exception:  # noqa: BLE001 - a listing or storage problem is the preflight's to say
        return None
    if not texts:
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(files / "tokenizer.json"))
    instruction = spec.task.resolved_instruction
    question = max(spec.task.questions, key=len, default=None)
    frame = frame_tokens_from_files(files, instruction, question)
    counts = [len(ids) for ids in (e.ids for e in tok.encode_batch([t for _, t in texts], add_special_tokens=False))]
    limit = context - spec.generation.max_new_tokens
    long = tuple((name, n + frame) for (name, _), n in zip(texts, counts, strict=True) if n + frame > limit)
    return Fit(method.name, context, spec.generation.max_new_tokens, len(texts), long)


def _first_texts(spec: JobSpec, run_date: str) -> list[tuple[str, str]]:
    """(document id, text) of the first readable documents, as the read stage reads them."""
    from stages.listing import list_shards, resolve_uri
    from stages.read import iter_shard

    root = resolve_uri(spec.input.uri, run_date)
    out: list[tuple[str, str]] = []
    for shard in list_shards(spec.input, run_date)[:FIRST_DOCUMENTS]:
        for doc in islice(iter_shard(shard, spec.input, root), FIRST_DOCUMENTS - len(out)):
            if doc.error is None and doc.text:
                out.append((doc.doc_id, doc.text))
        if len(out) >= FIRST_DOCUMENTS:
            break
    return out
