"""A document's requests: one per prompt, each with an id stable across runs.

Contract:
- ``generation_fingerprint(spec)``: the settings that change an output, as JSON; part of
  every request id (a setting added later stays out of it while at its default, so the
  rows of earlier runs keep their ids).
- ``request_id(doc_id, text, prompt, fingerprint)``: 24 hex digits of a sha256 over the
  document's id and text, the prompt and the fingerprint: the same document, prompt and
  settings give the same id in every run, so reruns skip what is done.
- ``plan_requests(doc, spec, fingerprint)`` computes a document's requests once (the read
  stage, where the text is at hand); ``expand_requests(doc, spec, run_id, run_date,
  fingerprint)`` returns one request row per document x prompt (schemas/rows.py
  ``RequestRow``), from the planned requests when the document carries them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from schemas.output import INPUT
from schemas.spec import JobSpec
from stages.read import REQUEST_PART_FIELDS, Document


def generation_fingerprint(spec: JobSpec) -> str:
    """Settings that change an output; part of every request_id."""
    settings = {
        "model": spec.generation.model,
        "max_new_tokens": spec.generation.max_new_tokens,
        "temperature": spec.generation.temperature,
        "top_p": spec.generation.top_p,
        "seed": spec.generation.seed,
        "stop": list(spec.generation.stop),
        "compression": spec.compression.fingerprint_settings(),
        "instruction": spec.task.resolved_instruction,
    }
    if spec.generation.top_k and spec.generation.temperature > 0:  # greedy ignores it; off, earlier ids stand
        settings["top_k"] = spec.generation.top_k
    if spec.generation.repeat_guard:  # it cuts outputs; off, earlier runs' request ids stand
        settings["repeat_guard"] = spec.generation.repeat_guard
    return json.dumps(settings, sort_keys=True)


def request_id(doc_id: str, text: str | None, prompt: str, fingerprint: str) -> str:
    h = hashlib.sha256()
    for part in (doc_id, text or "", prompt, fingerprint):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:24]


def plan_requests(doc: Document, spec: JobSpec, fingerprint: str) -> Document:
    """``doc`` with ``requests`` set: one entry (REQUEST_PART_FIELDS) per prompt, in order.

    The only place a request id is hashed (sha256 over the document's text, per prompt).
    A readable document with no question at all gets one request and its error set here,
    so every later step sees the same error. Returns ``doc`` itself (changed in place).
    """
    if doc.requests is not None:
        return doc
    instruction = spec.task.resolved_instruction
    if spec.task.kind == "summarize":
        pairs: list[tuple[str | None, str | None]] = [(None, None)]
    else:
        asked = list(zip(doc.questions, list(doc.answers) + [None] * len(doc.questions)))
        asked += [(q, None) for q in spec.task.questions]
        # A question the record and task.questions both ask is one request (its id hashes the
        # question), with the record's answer: the first of each.
        pairs, seen = [], set()
        for q, a in asked:
            if q not in seen:
                seen.add(q)
                pairs.append((q, a))
        if not pairs:
            pairs = [(None, None)]
            if doc.error is None:
                field = spec.input.question_field
                why = (f": its field {field!r} (input.question_field) is missing, null or empty, and "
                       f"task.questions is empty; fix: give the record its questions in {field!r}, or set "
                       "task.questions to ask every document") if field else ""
                doc.error = f"read: {doc.source_uri}: document {doc.doc_id!r} has no question{why}"
                doc.error_kind = INPUT
    parts = []
    for question, answer in pairs:
        prompt = question if question is not None else instruction
        parts.append({
            "request_id": request_id(doc.doc_id, doc.text, prompt, fingerprint),
            # A qa document with no question: its error row asks nothing (null), not the
            # default instruction it was never going to be asked; its id is hashed as before.
            "prompt": None if spec.task.kind == "qa" and question is None else prompt,
            "question": question,
            "reference": None if answer is None else str(answer),
        })
    doc.requests = parts
    return doc


def expand_requests(doc: Document, spec: JobSpec, run_id: str, run_date: str, fingerprint: str) -> list[dict[str, Any]]:
    """One request row per document x prompt (stages/rows.py's columns).

    Reuses ``doc.requests`` when the read stage planned them (``plan_requests``): the
    plan hashes each request once, in the read stage, and the expansion after
    ``input.limit`` only copies. ``fingerprint`` is ``generation_fingerprint(spec)``.
    """
    plan_requests(doc, spec, fingerprint)
    base = {
        "run_id": run_id,
        "run_date": run_date,
        "job": spec.name,
        "doc_id": doc.doc_id,
        "source_uri": doc.source_uri,
        "task": spec.task.kind,
        "instruction": spec.task.resolved_instruction,
        "text": doc.text,
        "error": doc.error,
        "error_kind": (doc.error_kind or INPUT) if doc.error else None,
    }
    parts = doc.requests or ()
    # doc_requests: the document's requests (a run that skips some sets it again: plan_inputs.py)
    return [{**base, **{k: part[k] for k in REQUEST_PART_FIELDS}, "doc_requests": len(parts)} for part in parts]
