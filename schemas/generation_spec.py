"""Generation and resources settings of the job spec: model, decoding, speculation, actors.

Split from schemas/spec.py (which re-exports every name) so each file stays one screenful
of concerns; the same contract holds: frozen models, unknown keys refused, every field
described.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from schemas.checks import FieldError, shown
from schemas.spec_base import EMBEDDED_MODEL, RANDOM_MODEL_SHAPES, _Strict, check_embedded_name


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
        "graphs of the eager kernels, GPU only: seconds per shape, one compilation per batch x width x "
        "attention span), off (eager). auto: inductor on a GPU, "
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
                f"unknown random model {shown(v)}; allowed: "
                + ", ".join("random:" + s for s in RANDOM_MODEL_SHAPES)
            )
        return check_embedded_name(v, "model")


# ----------------------------------------------------------------------------- resources
#: The most actors a pool may have: far above a real cluster, below what overflows Ray.
MAX_ACTORS = 10_000


class ResourcesSpec(_Strict):
    actors: int | tuple[int, int] = Field(
        default=1,
        description="Generate actor pool size, or [min, max] for an autoscaling pool.",
    )
    batch_size: int = Field(default=4, ge=1, le=100_000, description="Requests per generate batch.")
    decode_slots: int | None = Field(
        default=None, ge=1, le=1024,
        description="Rows the static engine decodes together (its KV slots; default: batch_size). A larger "
        "batch_size keeps the slots full: a finished row's slot takes the batch's next request.",
    )
    num_gpus: float = Field(default=0.0, ge=0.0, le=64, description="GPUs per generate actor (0 on CPU).")
    num_cpus: float = Field(default=1.0, gt=0.0, le=1024, description="CPUs per generate actor.")
    compress_actors: int = Field(
        default=1, ge=1, le=MAX_ACTORS, description="Actor pool size of text compression stages."
    )
    compress_num_gpus: float = Field(
        default=0.0, ge=0.0, le=64, description="GPUs per compression actor (may be fractional)."
    )
    max_retries: int = Field(
        default=2, ge=0, le=100, description="Retries of a failing request before it becomes an error row."
    )
    custom_resources: dict[Annotated[str, Field(min_length=1, max_length=200)], Annotated[float, Field(gt=0, le=1e6)]] = Field(
        default_factory=dict,
        description="Ray custom resources each generate actor needs, e.g. {gpu_pool: 1} to place the "
        "actors only on nodes started with `ray start --resources '{\"gpu_pool\": 4}'`. The embedded "
        "Ray (no --address) is given them, so the same spec runs on a laptop.",
    )
    schedule_timeout_s: float = Field(
        default=600.0, gt=0, le=7 * 24 * 3600,
        description="Seconds the generate actors may wait for a node with their resources (GPUs, "
        "custom_resources) while no batch completes; then the run aborts naming the missing resource "
        "and what the cluster has. Long enough for an autoscaler to add a node.",
    )

    @field_validator("actors")
    @classmethod
    def _actors_valid(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(v, int):
            if not 1 <= v <= MAX_ACTORS:
                raise ValueError(f"got {v}; allowed: 1 to {MAX_ACTORS}, or [min, max]")
        else:
            lo, hi = v
            if not 1 <= lo <= hi <= MAX_ACTORS:
                raise ValueError(f"actors [min, max] needs 1 <= min <= max <= {MAX_ACTORS}, got {list(v)}")
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
