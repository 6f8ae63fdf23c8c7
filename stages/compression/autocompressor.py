"""Method ``autocompressor``: summary vectors accumulated over segments, read as a soft prompt.

AutoCompressors (Chevalier et al., EMNLP 2023, https://arxiv.org/abs/2305.14788)
compress each ``segment_tokens`` segment of the document, read after the summaries of the
segments before it, into a few summary vectors; the summaries of all segments accumulate
and the generating model reads them as a soft prompt. That is what runs by default
(``summary_form`` vectors). The named variant ``summary_form: kv``
(stages/autocompressor/kv_form.py) is not the paper's: it keeps each segment as the
keys/values of every k-th token, where the document sits in the prompt, with a LoRA
trained to pack each stretch into its kept slot (learned token subsampling of the cache).
The checkpoint brings its own model and tokenizer (``tokenizer_source``), so it runs as a
prefill strategy inside the generate actor and reads documents of any length. This module
only declares the method; its settings (stages/autocompressor/config.py), the model,
checkpoints and training are stages/autocompressor/ (what each form measures: jobs/results/autocompressor/README.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.spec import JobSpec
from stages.autocompressor.config import AutoCompressorCompression
from stages.compression.base import CompressionMethod, Loaded

__all__ = ["AutoCompressorCompression", "AutoCompressorMethod"]

if TYPE_CHECKING:
    import torch

    from stages.compression.base import Budget
    from stages.prompting import PromptParts


class AutoCompressorMethod(CompressionMethod):
    name = "autocompressor"
    spec_model = AutoCompressorCompression
    summary = "summary vectors accumulated over segments, read as a soft prompt (`summary_form: kv`: every k-th token's keys/values with a LoRA)"
    paper = "https://arxiv.org/abs/2305.14788"
    order = 4
    runs_at = "prefill"
    needs = ("doc_ids",)
    reads_any_length = True
    needs_checkpoint = True

    def checkpoint(self, job: JobSpec) -> str:
        """compression.checkpoint, or the one of ``summary_form`` shipped for generation.model
        (ValueError if none, or if the named checkpoint is of another form)."""
        from stages.autocompressor.checkpoint_files import resolve_checkpoint

        config = self.config(job)
        return resolve_checkpoint(config.checkpoint, job.generation.model, config.summary_form)

    def problems(self, job: JobSpec) -> list[str]:
        """The checkpoint's own checks (stages/autocompressor/checkpoint_files.py ``checkpoint_problems``)."""
        from stages.autocompressor.checkpoint_files import checkpoint_problems

        config = self.config(job)
        return checkpoint_problems(config.checkpoint, job.generation.model, config.summary_form)

    def tokenizer_source(self, job: JobSpec) -> str:
        from stages.autocompressor.checkpoint_files import tokenizer_source

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
