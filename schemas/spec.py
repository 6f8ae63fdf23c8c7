"""The job spec: one YAML file a user writes, validated before anything heavy starts.

Contract: every model here is frozen and forbids unknown keys, so a typo in a YAML
key is an error that names the field path, never a silently ignored setting. Every
field has a description (shown by ``longdoc validate``) and a sensible default.
This module imports only schemas/ modules; each compression method's settings are
found by plugin discovery (schemas/compression.py). Generation and resources
settings live in schemas/generation_spec.py, shared names and the strict base in
schemas/spec_base.py; every name is importable from here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from schemas.checks import (
    INPUT_PLACEHOLDERS,
    NAME_RE,
    OUTPUT_PLACEHOLDERS,
    FieldError,
    check_output_root,
    check_uri,
    location,
    shown,
)
from schemas.compression import (
    CompressionJsonSchema,
    CompressionSpec,
    NoCompression,
    compression_models,
    validate_compression,
)
from schemas.generation_spec import GenerationSpec, ResourcesSpec, SpeculativeSpec  # noqa: F401 - re-exported
from schemas.spec_base import (  # noqa: F401 - re-exported: the spec's names live here
    DEFAULT_MAX_DOC_BYTES,
    DEFAULT_MAX_DOC_TOKENS,
    DEFAULT_QA_INSTRUCTION,
    DEFAULT_SUMMARY_INSTRUCTION,
    EMBEDDED_EMBEDDER,
    EMBEDDED_MODEL,
    EMBEDDED_NAMES,
    RANDOM_MODEL_SHAPES,
    _Strict,
    check_embedded_name,
)

# ----------------------------------------------------------------------------- input
#: File suffixes of each input format (stages/read.py lists folders with them).
FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "text": (".txt", ".md"),
    "jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.bz2"),  # compressed: stages/read.py open_input
    "parquet": (".parquet",),
}
#: Upper bounds: far above any real use, below what overflows Ray, the OS or a read buffer.
MAX_DOCUMENTS = 10**12
MAX_DOC_BYTES_LIMIT = 2**31  # one read holds the document: 2 GiB is already absurd for an LLM
MAX_DOC_TOKENS_LIMIT = 100_000_000
#: An instruction or question is part of every prompt: 100k characters (~25k tokens) already
#: fills the context of most models, and a longer one can never fit.
MAX_PROMPT_CHARS = 100_000


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
        default=None, ge=1, le=MAX_DOCUMENTS, description="Read at most this many documents (in listing order)."
    )
    max_doc_bytes: int = Field(
        default=DEFAULT_MAX_DOC_BYTES,
        ge=1,
        le=MAX_DOC_BYTES_LIMIT,
        description="A document (a text file, a JSONL line, a Parquet text value) over this many "
        "bytes becomes an error row without being read whole. Default 8 MiB.",
    )
    max_doc_tokens: int = Field(
        default=DEFAULT_MAX_DOC_TOKENS,
        ge=1,
        le=MAX_DOC_TOKENS_LIMIT,
        description="A document over this many generator tokens becomes an error row: the "
        "n-gram lookup index (~0.6 KB per token) and the token ids grow with it. Default 200000.",
    )

    @field_validator("uri")
    @classmethod
    def _uri_supported(cls, v: str) -> str:
        return check_uri(v, INPUT_PLACEHOLDERS)

    @model_validator(mode="after")
    def _fields_need_records(self) -> InputSpec:
        # A text file is one document with no fields: a question field would silently give
        # every row "document has no question".
        if self.format == "text":
            for name in ("question_field", "answer_field"):
                if getattr(self, name):
                    raise FieldError(
                        name,
                        f"got {shown(getattr(self, name))}, but format text has no fields (a file is "
                        "one document); allowed: format jsonl or parquet, or task.questions",
                    )
        return self

    @model_validator(mode="after")
    def _format_matches_file(self) -> InputSpec:
        # A URI naming one file with another format's suffix is a mix-up caught here;
        # a folder (or an unknown suffix) is left to the reader.
        name = self.uri.rstrip("/").rsplit("/", 1)[-1].lower()
        for fmt, suffixes in FORMAT_SUFFIXES.items():
            if fmt != self.format and name.endswith(suffixes) and not name.endswith(FORMAT_SUFFIXES[self.format]):
                raise FieldError(
                    "format",
                    f"is {shown(self.format)} but input.uri names a {suffixes[0]} file ({shown(name)}); "
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
        max_length=MAX_PROMPT_CHARS,
        description="Summary instruction (summarize) or answering preamble (qa). "
        "Default depends on kind.",
    )
    questions: tuple[Annotated[str, Field(max_length=MAX_PROMPT_CHARS)], ...] = Field(
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



class OutputSpec(_Strict):
    uri: str = Field(
        default="out/{job}",
        description="fsspec URI of the output table; {job} and {run_date} are substituted. "
        "Rows land under run_date=YYYY-MM-DD/ (hive partitioning).",
    )
    keep_context: bool = Field(
        default=False,
        description="Store the document text the model read in the output column context: the "
        "kept text of a text method (e.g. truncate, rag, bm25) or of a method that prefills the "
        "sentences it picked (select), the whole document for none. Off by default: it "
        "repeats (part of) every document in every row. KV methods (finch, autocompressor) "
        "leave it null; their kept_spans say what was kept.",
    )

    @field_validator("uri")
    @classmethod
    def _uri_supported(cls, v: str) -> str:
        return check_output_root(check_uri(v, OUTPUT_PLACEHOLDERS))


class CostSpec(_Strict):
    usd_per_device_hour: float = Field(
        default=0.0,
        ge=0.0,
        le=1_000_000.0,
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
                f"got {shown(v)}; allowed: a path-safe word of 1-100 A-Z a-z 0-9 . _ - (no leading '.')"
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
        # Writing into the corpus would make the next run read its own output. Compared as
        # locations, not strings: `file://` prefixes, `..`, `./`, doubled slashes and the
        # gcs:// alias of gs:// all name the same place (symlinks: check_environment).
        out = location(self.output.uri.replace("{job}", self.name))
        inp = location(self.input.uri)
        if out == inp or out.startswith(inp.rstrip("/") + "/"):
            raise FieldError(
                "output.uri",
                f"{shown(self.output.uri)} is the input.uri {shown(self.input.uri)} or inside it; "
                "allowed: a location outside the input",
            )
        return self

    @model_validator(mode="after")
    def _cudagraphs_need_a_gpu(self) -> JobSpec:
        if self.generation.compile == "cudagraphs" and self.resources.num_gpus == 0:
            raise FieldError(
                "generation.compile",
                "got 'cudagraphs', which captures CUDA graphs, but resources.num_gpus is 0 (the "
                "actors run on CPU); allowed on CPU: auto, inductor, off (or set resources.num_gpus)",
            )
        return self

    @property
    def reuses_document_prefix(self) -> bool:
        """Whether the engine's prefix cache is on (``generation.prefix_cache`` resolved)."""
        mode = self.generation.prefix_cache
        if mode == "auto":
            return self.task.kind == "qa" and self.compression.shares_document_prefix
        return mode == "on"

    @model_validator(mode="after")
    def _prefix_cache_needs_a_shared_prefix(self) -> JobSpec:
        if self.generation.prefix_cache == "on" and not self.compression.shares_document_prefix:
            allowed = sorted(
                name for name, model in compression_models().items() if model.shares_document_prefix
            )
            raise FieldError(
                "generation.prefix_cache",
                f"got 'on', but compression.method {self.compression.method} keeps a context "
                "that depends on the question or prefills in its own way, so requests share no "
                f"prefix to reuse; allowed: auto or off, or compression.method {' or '.join(allowed)}",
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
                        f"got {shown(value)}, but task.kind summarize reads no questions or answers; "
                        "allowed: set task.kind: qa, or remove it",
                    )
        return self

    @model_validator(mode="after")
    def _answers_need_questions(self) -> JobSpec:
        if self.input.answer_field and not self.input.question_field:
            raise FieldError(
                "input.answer_field",
                f"{shown(self.input.answer_field)} pairs answers with the questions of "
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
