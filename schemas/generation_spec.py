"""Generation and resources settings of the job spec: model, decoding, speculation, actors.

One concern of the job spec, the generating side (schemas/spec.py, the spec as a whole,
re-exports every name); the same contract holds: frozen models, unknown keys refused,
every field described.
"""

from __future__ import annotations

import importlib
import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from schemas.checks import FieldError, shown
from schemas.spec_base import EMBEDDED_MODEL, RANDOM_MODEL_SHAPES, _Strict, check_embedded_name

# ----------------------------------------------------------------------------- generation
#: The package whose modules define the drafters (stages/decoding/drafters/). Schemas
#: import nothing of the project statically, so it is loaded by name (plugin discovery).
DRAFTER_PLUGINS = "stages.decoding.drafters"


def speculative_methods() -> tuple[str, ...]:
    """Every value ``generation.speculative.method`` accepts: none and each drafter's name."""
    return tuple(importlib.import_module(DRAFTER_PLUGINS).drafter_names())


class SpeculativeSpec(_Strict):
    method: str = Field(
        default="prompt_lookup",
        description="A drafter's name (stages/decoding/drafters/, one module each; `longdoc methods` "
        "lists them with where their drafts come from), its drafts verified in one forward pass; "
        "none: plain decoding.",
    )
    # Defaults measured with the adaptive engine (`longdoc bench decode --suite cpu-targets`):
    # longer suffixes give a sharper acceptance signal; the engine shortens drafts itself.
    num_draft_tokens: int = Field(default=16, ge=1, le=64, description="Most draft tokens per step.")
    max_ngram: int = Field(default=6, ge=1, le=16, description="Longest suffix n-gram searched.")
    min_ngram: int = Field(default=1, ge=1, le=16, description="Shortest suffix n-gram searched.")
    adaptive: bool = Field(
        default=True,
        description="Per row, grow the draft length after full acceptance and shrink it after "
        "rejections, down to not drafting, so speculation never costs more than it saves. The "
        "width also weighs the measured cost of a verify step, so the draft figures vary from "
        "run to run; the text does not (greedy, or a row's seed: stages/decoding/verify.py). "
        "false: figures that repeat.",
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        allowed = speculative_methods()
        if v not in allowed:
            raise ValueError(f"unknown speculative method {v!r}; allowed: {', '.join(allowed)}")
        return v

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
    top_k: int = Field(default=0, ge=0, le=100_000, description=(
        "Sample only among the k most likely tokens, before top_p (sampling only); 0 = off."))
    seed: int = Field(default=0, description="Sampling seed; each request derives its own from it.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="auto: float32 on CPU; on a GPU bfloat16, but float32 for models under 1B parameters "
        "(launch-bound there, so fp32 costs little and is exact: greedy output with prompt lookup equals "
        "plain greedy in fp32; jobs/results/code-choices.md). bf16 agreement is measured by "
        "`longdoc bench decode`.",
    )
    compile: Literal["auto", "inductor", "cudagraphs", "off"] = Field(
        default="auto",
        description="Decode steps: cudagraphs (the eager step captured as CUDA graphs, GPU only: no "
        "compilation, one capture per batch x width x attention span, a fraction of a second each; "
        "replays the eager step bit for bit), inductor (torch.compile with CUDA graphs on a GPU; "
        "minutes of compilation per actor), off (eager, exact shapes; on CPU with the measured "
        "kernel plan). auto: cudagraphs on a GPU, off on CPU. Steps are captured or compiled once "
        "per actor, before the first batch.",
    )
    prefix_cache: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Prefill the prompt up to the question once per document and reuse its KV "
        "cache for the document's other questions (each request's prefill is split there, so "
        "a request decodes the same text whether its prefix was cached or not). Needs a "
        "compression method whose kept context depends on the document alone and which the "
        "engine prefills itself (none, truncate). auto: on for task.kind qa with such a "
        "method, off otherwise (a summary's prompt is one per document: nothing to reuse).",
    )
    stop: tuple[Annotated[str, Field(min_length=1)], ...] = Field(
        default=(), description="Extra stop strings (EOS always stops); an empty one would stop at once."
    )
    repeat_guard: int = Field(
        default=0, ge=0, le=64,
        description="Stop a row whose last N tokens repeat an earlier stretch of its own output (a small "
        "model looping on a sentence), keeping the text before the loop and its first cycle; 0 = off. The output is then "
        "a prefix of plain greedy's, with or without speculation. 8-16 suits summaries.",
    )
    # On by default: greedy output is identical to plain decoding, sampling keeps the
    # model's distribution, and adaptive drafting stops drafting where nothing matches.
    speculative: SpeculativeSpec = Field(
        default_factory=SpeculativeSpec,
        description="Prompt-lookup speculative decoding settings (on by default; method: none turns it off).",
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        # YAML 1.1 (PyYAML) reads an unquoted `compile: off` as the boolean false.
        return "off" if v is False else v

    @field_validator("prefix_cache", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: object) -> object:
        # YAML 1.1 reads unquoted `on` / `off` as booleans.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

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
#: KV memory of one actor, in GiB: 64 TiB is far above any machine; 1e30 is a typo.
MAX_KV_MEMORY_GB = 65536


class ResourcesSpec(_Strict):
    actors: int | tuple[int, int] = Field(
        default=1,
        description="Generate actor pool size, or [min, max] for an autoscaling pool.",
    )
    batch_size: int = Field(default=4, ge=1, le=100_000, description="Requests per generate batch.")
    decode_slots: Literal["auto"] | Annotated[int, Field(ge=1, le=256)] = Field(
        default="auto",
        description="Rows the engine decodes together. auto: as many as their KV tokens fit in the memory "
        "budget (kv_memory_gb / kv_memory_fraction), so compressed rows (short caches) fill more slots; "
        "a number (1-256) fixes the slot count. Requests of several batches share the slots.",
    )
    kv_memory_gb: float | None = Field(
        default=None, gt=0.0, le=MAX_KV_MEMORY_GB,
        description="KV cache memory per generate actor in GiB (overrides kv_memory_fraction).",
    )
    kv_memory_fraction: float | None = Field(
        default=None, gt=0.0, le=0.95,
        description="KV cache memory per generate actor as a fraction of the GPU memory free after the "
        "weights load, or of the RAM available on CPU. Default: 0.85 on a GPU, 0.25 on CPU.",
    )
    num_gpus: float = Field(default=0.0, ge=0.0, le=64, description="GPUs per generate actor (0 on CPU).")
    num_cpus: Literal["auto"] | Annotated[float, Field(gt=0.0, le=1024)] = Field(
        default="auto",
        description="CPUs per generate actor: Ray schedules by it, and on CPU it is the actor's torch "
        "threads. auto: run on this machine (in-process, or an embedded Ray), the cores this process "
        "may use (OMP_NUM_THREADS when set) shared among the generate actors; on a Ray cluster "
        "(--address, $RAY_ADDRESS) or in `render`, 1: set it to your nodes' cores per actor.",
    )
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

    @property
    def max_actors(self) -> int:
        """The generate pool's size, its largest for an autoscaling ``[min, max]``."""
        return self.actors if isinstance(self.actors, int) else self.actors[1]

    def cpus_per_actor(self, machine_cores: int | None, engines: int) -> float:
        """``num_cpus`` as a number. ``auto``: ``machine_cores`` (the cores of the one machine a
        run uses; None on a Ray cluster, whose nodes are not known where the run starts: 1)
        shared by ``engines`` generate engines, at least one core each."""
        if self.num_cpus != "auto":
            return float(self.num_cpus)
        if machine_cores is None:
            return 1.0
        return float(max(1, machine_cores // max(1, engines)))

    @field_validator("kv_memory_gb")
    @classmethod
    def _finite_memory(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"got {v}; allowed: a finite number of GiB > 0")
        return v

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
