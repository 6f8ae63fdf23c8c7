"""Running any registered compression method end to end in-process (no Ray).

``MethodEnv`` (fixture ``method_env`` in tests/stages/conftest.py): a tiny random
Llama with a WINDOW-token context (so a longer document is "longer than the model's
context") saved with the embedded tokenizer, and AutoCompressor checkpoints over it
(summary vectors; the kv form as the VARIANTS case ``autocompressor-kv``; finch's
``keep: sentences`` as ``finch-kv-sentences``). ``spec``
builds any method's (or case's) JobSpec on it; ``request`` a RequestRow; ``text_stages``
the stages before generate, chained as pipeline/plan.py chains them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.loading import spec_from_dict
from schemas.spec import JobSpec
from stages.compression import method_for, registry

WINDOW = 1024  # the tiny model's context window
TARGET = 48  # every budgeted method's target_tokens in these tests


# Further cases of the shared matrix: a method run in another form that takes another
# code path (case name -> method). Their settings are MethodEnv.variants[case].
# The kv summary form (the shipped default), and Finch keeping whole sentences' keys and values.
VARIANTS = {"autocompressor-kv": "autocompressor", "finch-kv-sentences": "finch"}


def method_of(case: str) -> str:
    """The registered method a matrix case runs (a method name is its own case)."""
    return VARIANTS.get(case, case)


def cases() -> list[str]:
    """Every registered method, then the VARIANTS: what the shared matrix runs."""
    from stages.compression import method_names

    return [*method_names(), *VARIANTS]


@dataclass(frozen=True)
class MethodEnv:
    model_dir: Path
    required: dict[str, str]  # settings the tiny model needs (every required field, and e.g. checkpoint) -> value
    variants: dict[str, dict[str, str]] = field(default_factory=dict)  # case -> settings over ``required``

    def spec(self, case: str, **generation: Any) -> dict[str, Any]:
        """A JobSpec (as JSON) running ``case`` (a method or a VARIANTS case) on the tiny model, budget TARGET.

        Settings: target_tokens = TARGET when the method has it; a field without a
        default takes ``required[field]`` (a new method with a new required field
        adds its value to ``method_env`` below); a variant's settings replace those.
        """
        method = method_of(case)
        required = {**self.required, **self.variants.get(case, {})}
        fields = registry()[method].spec_model.model_fields
        compression: dict[str, Any] = {"method": method}
        if "target_tokens" in fields:
            compression["target_tokens"] = TARGET
        for name, info in fields.items():
            if info.is_required() and name != "method":
                assert name in required, f"method_env has no value for required field {name!r}"
            if name in required:  # also optional ones the tiny model needs (checkpoint)
                compression[name] = required[name]
        return spec_from_dict(
            {
                "name": "m",
                "input": {"uri": "/unused"},
                "task": {"kind": "qa", "questions": ["Which river is it?"]},
                "compression": compression,
                "generation": {"model": str(self.model_dir), "max_new_tokens": 5, **generation},
            }
        ).model_dump(mode="json")


def request(i: int, text: str | None, question: str | None = "Which river is it?", error: str | None = None) -> dict:
    """A RequestRow (schemas/rows.py) as stages/requests.py makes it."""
    return {
        "request_id": f"r{i}", "run_id": "run", "run_date": "2026-01-01", "job": "m",
        "doc_id": f"d{i}", "source_uri": f"f{i}", "task": "qa", "prompt": question or "Summarize.",
        "instruction": "Answer briefly.", "question": question, "reference": None, "text": text,
        "error": error, "error_kind": "input" if error else None, "doc_requests": 1,
    }  # fmt: skip


def text_stages(spec: dict[str, Any]) -> list[Callable]:
    """The stages before generate for ``spec``, as the plan chains them."""
    from stages.tokenize import TokenizeStage

    method = method_for(JobSpec.model_validate(spec).compression)
    stages: list[Callable] = [TokenizeStage(spec)]
    if method.runs_at == "text_stage":
        stages.append(method.stage_class()(spec))
    return stages


def method_batches(env: MethodEnv, texts: list[str]) -> dict[str, dict]:
    """Per registered method: a batch of requests over ``texts`` after the stages before generate."""
    from stages.compression import method_names
    from stages.rows import rows_to_batch

    out = {}
    for m in method_names():
        batch = rows_to_batch([request(i, t) for i, t in enumerate(texts)])
        for stage in text_stages(env.spec(m)):
            batch = stage(batch)
        out[m] = batch
    return out
