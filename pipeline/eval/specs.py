"""The runs of `longdoc eval` and their JobSpecs.

Contract:
- ``plan_runs`` lists the runs, methods from the registry (stages/compression/) in
  display order: every ``eval_budgeted`` method (truncate, rag, finch, ...) once per
  ``target_tokens``; the others (none: the whole document; autocompressor: summary
  vectors of the whole document) once. A method that ``needs_checkpoint`` is in the
  default list only when ``--autocompressor PATH`` gives one (it becomes
  compression.checkpoint); named in ``--methods`` without it, it runs with the
  checkpoint its settings default to (the one shipped for generation.model, if any:
  otherwise that run fails with the method's error).
- ``split_overrides`` sorts ``--set`` items: ``key=value`` applies to every run,
  ``METHOD:key=value`` to that method's runs only. Compression, input and output are
  set per run by the eval, so unscoped overrides of them are refused.
- ``build_eval_spec`` makes one run's JobSpec: the eval set as qa JSONL (fields id,
  text, questions, answers), the method at the budget, output at ``run_dir``, and the
  generate actor's CPUs when given (`longdoc eval` on the embedded Ray gives it every
  core of the machine: the spec default of one left half of a 2-core machine idle).
- ``load_question_meta`` reads each question's ``kind``, ``style`` and ``depths`` entry.
- ``equal_reading_plan`` checks ``--equal-reading REF`` (a budgeted method of the eval) and
  ``--equal-methods`` (default rag, bm25): each of those runs again per budget B at the
  mean context_tokens REF kept at B (``EvalRun.equal_to`` = "REF@B").
Bad values raise ValueError naming the value and what is allowed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.eval.table import QuestionMeta
from stages.compression import method_names, registry

METHODS = method_names()
BUDGETED = tuple(m.name for m in registry().values() if m.eval_budgeted)
UNBUDGETED = tuple(m for m in METHODS if m not in BUDGETED)
NEEDS_CHECKPOINT = tuple(m.name for m in registry().values() if m.needs_checkpoint)


@dataclass(frozen=True)
class EvalRun:
    method: str
    target_tokens: int | None  # None: the method takes no budget
    # equal reading: the run ("finch@512") whose mean context_tokens set target_tokens
    equal_to: str | None = None

    @property
    def tag(self) -> str:
        tag = f"{self.method}-{self.target_tokens or 'full'}"
        return tag + (f"-eq-{self.equal_to.replace('@', '-')}" if self.equal_to else "")


def plan_runs(
    methods: list[str] | None, budgets: list[int], autocompressor: str | None
) -> list[EvalRun]:
    names = [m.strip() for item in methods or [] for m in item.split(",") if m.strip()]
    if not names:
        names = [m for m in METHODS if autocompressor or m not in NEEDS_CHECKPOINT]
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; allowed: {', '.join(METHODS)}")
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError(f"--target-tokens must be one or more integers >= 1, got {budgets}")
    runs: list[EvalRun] = []
    for m in dict.fromkeys(names):
        budgets_of_m = [None] if m in UNBUDGETED else list(dict.fromkeys(budgets))
        runs += [EvalRun(m, b) for b in budgets_of_m]
    return runs


def equal_reading_plan(
    reference: list[str] | None, equal_methods: list[str] | None, runs: list[EvalRun]
) -> tuple[list[str], list[str]]:
    """(reference methods, methods run at their reading) for ``--equal-reading``, checked:
    a reference must be a budgeted method among ``runs``, an equal method a budgeted one."""
    refs = [m.strip() for item in reference or [] for m in item.split(",") if m.strip()]
    if not refs:
        return [], []
    others = [m.strip() for item in equal_methods or ["rag,bm25"] for m in item.split(",") if m.strip()]
    ran = {r.method for r in runs if r.target_tokens is not None}
    bad = [m for m in refs if m not in ran]
    if bad:
        raise ValueError(f"--equal-reading {bad}: not a budgeted method of this eval; run: {sorted(ran)}")
    bad = [m for m in others if m not in BUDGETED]
    if bad:
        raise ValueError(f"--equal-methods {bad}: allowed budgeted methods {', '.join(BUDGETED)}")
    return refs, others


def split_overrides(
    overrides: list[str], methods: set[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """(overrides for every run, overrides per method) from ``[METHOD:]key=value`` items."""
    common: list[str] = []
    scoped: dict[str, list[str]] = {}
    for item in overrides:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head:
            if head not in methods:
                raise ValueError(
                    f"override {item!r} names method {head!r}; methods run: {sorted(methods)}"
                )
            scoped.setdefault(head, []).append(rest)
            continue
        key = item.split("=", 1)[0].strip()
        if key.startswith(("compression.", "output.", "input.")) or key in ("compression", "name"):
            raise ValueError(
                f"override {item!r}: the eval sets {key.split('.')[0]} per run; scope compression "
                "settings to a method (--set rag:compression.chunk_tokens=128)"
            )
        common.append(item)
    return common, scoped


def build_eval_spec(
    run: EvalRun,
    eval_set: str,
    run_dir: str,
    *,
    max_new_tokens: int,
    limit: int | None,
    overrides: list[str],
    autocompressor: str | None = None,
):
    """One run's JobSpec (``resources`` as the spec defaults them, or as an override sets them:
    ``num_cpus: auto`` gives the one engine every core of this machine)."""
    from schemas.loading import apply_overrides, spec_from_dict

    compression: dict[str, Any] = {"method": run.method}
    if run.target_tokens is not None:
        compression["target_tokens"] = run.target_tokens
    if run.method in NEEDS_CHECKPOINT and autocompressor:
        compression["checkpoint"] = autocompressor
    data = {
        "name": f"eval-{run.tag}",
        "input": {
            "uri": eval_set,
            "format": "jsonl",
            "id_field": "id",
            "text_field": "text",
            "question_field": "questions",
            "answer_field": "answers",
            "limit": limit,
        },
        "task": {"kind": "qa"},
        "compression": compression,
        "generation": {"max_new_tokens": max_new_tokens},
        "output": {"uri": run_dir},
    }
    return spec_from_dict(apply_overrides(data, overrides), source=f"eval run {run.tag}")


def load_question_meta(eval_set: str) -> QuestionMeta:
    """(doc id, question) -> {kind, style, depth} from the eval set's parallel lists, if present."""
    import fsspec

    meta: QuestionMeta = {}
    with fsspec.open(eval_set, "r", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # an error row of the run (pipeline/eval/checks.py notes it)
            if not isinstance(rec, dict):
                continue
            qs = rec.get("questions") or []
            qs = qs if isinstance(qs, list) else [qs]  # one question, or a value the reader refuses
            lists = {"kind": rec.get("kind"), "style": rec.get("style"), "depth": rec.get("depths")}
            for i, q in enumerate(qs):
                meta[(str(rec.get("id")), str(q))] = {
                    name: (v[i] if i < len(v) else None) if isinstance(v, list) else (None if name == "depth" else v)
                    for name, v in lists.items()
                }
    return meta
