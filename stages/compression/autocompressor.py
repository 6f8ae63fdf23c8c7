"""Method ``autocompressor``: learned summaries per segment (kept keys/values or soft-prompt vectors).

AutoCompressors (Chevalier et al., EMNLP 2023, https://arxiv.org/abs/2305.14788)
compress each ``segment_tokens`` segment of the document into a few summary vectors
that the generating model reads as a soft prompt. The checkpoint brings its own model
and tokenizer (``tokenizer_source``), so it runs as a prefill strategy inside the
generate actor and reads documents of any length. A checkpoint of summary form ``kv``
(stages/autocompressor/kv_form.py) keeps each segment as the keys/values of every k-th
token instead, where the document sits in the prompt. This module only declares the
method and its settings; the model, checkpoints and training are stages/autocompressor/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from schemas.compression import CompressionSpec
from schemas.spec import JobSpec
from stages.compression.base import CompressionMethod, Loaded

if TYPE_CHECKING:
    import torch

    from stages.context_budget import Budget
    from stages.prompting import PromptParts


class AutoCompressorCompression(CompressionSpec):
    """Compress the document into learned summary vectors, used as a soft prompt."""

    method: Literal["autocompressor"] = "autocompressor"
    checkpoint: str | None = Field(
        default=None,
        description="AutoCompressor checkpoint: a directory saved by `longdoc train-autocompressor`, "
        "or a published princeton-nlp AutoCompressor id/path. Unset: the checkpoint shipped for "
        "generation.model (the embedded SmolLM2-135M has one; other models must set this).",
    )
    segment_tokens: int = Field(
        default=1024, ge=16, description="Document tokens per compressed segment."
    )
    target_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Optional: read at most this many document tokens (tail kept) before compressing.",
    )
    soft_prompt_at: Literal["start", "document"] = Field(
        default="start",
        description="Where the summary vectors go in the prompt. start: before the whole prompt "
        "(the published checkpoints' convention and what training teaches); document: where the "
        "document text would sit, after the chat-template prefix. Summary vectors only: a "
        "checkpoint of summary form kv always keeps its slots where the document sits.",
    )


class AutoCompressorMethod(CompressionMethod):
    name = "autocompressor"
    spec_model = AutoCompressorCompression
    summary = "learned summaries per segment: kept keys/values of every k-th token (the embedded model's default) or soft-prompt vectors"
    paper = "https://arxiv.org/abs/2305.14788"
    order = 4
    runs_at = "prefill"
    needs = ("doc_ids",)
    reads_any_length = True
    needs_checkpoint = True

    def checkpoint(self, job: JobSpec) -> str:
        """compression.checkpoint, or the one shipped for generation.model (ValueError if none)."""
        from stages.autocompressor.checkpoint import resolve_checkpoint

        return resolve_checkpoint(self.config(job).checkpoint, job.generation.model)

    def tokenizer_source(self, job: JobSpec) -> str:
        from stages.autocompressor.checkpoint import tokenizer_source

        return tokenizer_source(self.checkpoint(job))

    def load(self, job: JobSpec, device: torch.device) -> Loaded:
        from stages.autocompressor.prefill import autocompressor_prefill, load_autocompressor

        config = self.config(job)
        lm, tok, ac = load_autocompressor(self.checkpoint(job), job.generation.dtype, device)
        pad = tok.pad_token_id
        return Loaded(lm, tok, lambda parts: autocompressor_prefill(ac, parts, config, pad))

    def budgets(self, job: JobSpec) -> tuple[Budget, ...]:
        """None of its settings sits in the context whole: target_tokens caps what is read,
        and the read is compressed into summaries segment by segment."""
        return ()

    def kv_tokens(self, job: JobSpec, parts: PromptParts) -> int | None:
        """An upper bound before the checkpoint is read: the prompt with the document part it
        reads (summaries are shorter than their text; the engine corrects it after the prefill)."""
        target = self.config(job).target_tokens
        doc = len(parts.context_ids) if target is None else min(target, len(parts.context_ids))
        return len(parts.prefix_ids) + doc + len(parts.query_ids) + 1  # + the first segment's BOS
