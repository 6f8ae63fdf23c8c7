"""The ``autocompressor`` method's settings (``compression:`` in a job spec), beside its algorithm.

The registry module (stages/compression/autocompressor.py) declares the method and
names this model as its ``spec_model``; the prefill (prefill.py) reads it. Defined here,
where the algorithm lives, so the algorithm never imports the registry back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.compression import CompressionSpec

# The model's settings as types, here (pydantic only) so that the training command lists
# them in its --help without importing torch; model.py's ACConfig uses them.
#: How summaries re-enter the model (ACConfig.summary_scale).
SummaryScale = Literal["none", "embedding_rms", "centered"]
#: Which AutoCompressor: summary vectors or kept keys/values (ACConfig.summary_form).
SummaryForm = Literal["vectors", "kv"]
#: Document tokens per segment when compression.segment_tokens is unset, by the checkpoint's
#: form: what each shipped checkpoint was trained near and measured at
#: (jobs/results/autocompressor/README.md). A segment far longer than training saw packs more
#: text into the same summary vectors than they learned to hold.
SEGMENT_TOKENS: dict[str, int] = {"vectors": 512, "kv": 1024}


class AutoCompressorCompression(CompressionSpec):
    """Compress the document into learned summary vectors, used as a soft prompt."""

    method: Literal["autocompressor"] = "autocompressor"
    checkpoint: str | None = Field(
        default=None,
        description="AutoCompressor checkpoint: a directory saved by `longdoc train-autocompressor`, "
        "or a published princeton-nlp AutoCompressor id/path. Unset: the checkpoint shipped for "
        "generation.model (the embedded SmolLM2-135M has one; other models must set this).",
    )
    segment_tokens: int | None = Field(
        default=None, ge=16,
        description="Document tokens per compressed segment. Unset: the checkpoint's form decides "
        "(SEGMENT_TOKENS: 512 for summary vectors, whose shipped checkpoint was trained on segments of "
        "64-448 tokens and measured at 512; 1024 for kv, as trained and measured).",
    )
    target_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Optional: read at most this many document tokens (tail kept) before compressing.",
    )
    summary_form: SummaryForm | None = Field(
        default=None,
        description="Which AutoCompressor. vectors: the paper's, summary vectors accumulated over "
        "segments and read as a soft prompt. kv: the named variant, every k-th token's keys/values "
        "kept per segment with a LoRA (learned token subsampling, not summary tokens). Unset: the "
        "form of compression.checkpoint when set, else vectors. Picks the shipped checkpoint when "
        "compression.checkpoint is unset; a named checkpoint of another form is refused.",
    )
    soft_prompt_at: Literal["start", "document"] = Field(
        default="start",
        description="Where the summary vectors go in the prompt. start: before the whole prompt "
        "(the published checkpoints' convention and what training teaches); document: where the "
        "document text would sit, after the chat-template prefix. Summary vectors only: a "
        "checkpoint of summary form kv always keeps its slots where the document sits.",
    )

    def segment_tokens_for(self, form: str) -> int:
        """Document tokens per segment for a checkpoint of summary form ``form``: the setting,
        else ``SEGMENT_TOKENS[form]``."""
        return self.segment_tokens or SEGMENT_TOKENS[form]

    def fingerprint_settings(self) -> dict[str, Any]:
        """The settings with the segment length a run uses written in when it is unset (the
        checkpoint's form decides it): a kv job's request ids stay those of the 1024 it always
        ran with, and a later change of SEGMENT_TOKENS changes the ids of the rows it changes."""
        from stages.autocompressor.checkpoint_files import checkpoint_form

        settings = super().fingerprint_settings()
        if self.segment_tokens is None:
            form = self.summary_form or (checkpoint_form(self.checkpoint) if self.checkpoint else "vectors")
            settings["segment_tokens"] = SEGMENT_TOKENS[form]
        return settings
