"""Method ``select``: read the document once through the retrieval heads' layers, then
prefill only the sentences they pick.

What it does (the project's own method, built on Finch's chunked reading pass; it is
not the Finch paper, whose kept KV entries are the cache: that is method ``finch``):
1. The document is read chunk by chunk, each chunk after the prompt's prefix only,
   through the layers up to the deepest calibrated retrieval head (early exit, as in
   GemFilter, Shi et al. 2024); a document's questions share that pass, each scoring
   the chunks with its own attention (stages/finch/shared.py).
2. Whole sentences are chosen by the heads' evidence fused with an embedder's
   similarity to the question, with a relevance floor and the next sentence of a
   paragraph brought along (qa), laid out least relevant first (stages/finch/fusion.py).
3. Only those sentences are prefilled through the generating model.
With ``scorer`` set, a smaller model (e.g. the embedded SmolLM2-135M and its shipped
heads) does steps 1-2 for a larger generator, in sentences, so the two need not share
a tokenizer; the budget counts the generator's tokens (stages/finch/scorer.py).
The scorer runs inside the generate actor, on the generator's device: it is small, it
reads each document once for all its questions, and its kept text goes straight to the
generator's prefill with nothing to ship between actors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.checks import shown
from schemas.spec import EMBEDDED_MODEL, JobSpec
from stages.compression.base import Loaded
from stages.compression.finch import FinchMethod, prompt_similarity, warn_uncalibrated
from stages.finch.config import SelectCompression

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from stages.decoding.state import CompressedPrefill
    from stages.prompting import PromptParts


class SelectMethod(FinchMethod):
    name = "select"
    spec_model = SelectCompression
    summary = (
        "the sentences the question's retrieval heads and the embedder point to, read once per "
        "document through the heads' layers (optionally by a small scorer model); only they are prefilled"
    )
    paper = "https://arxiv.org/abs/2409.17422"  # GemFilter: early-layer selection, then prefill
    order = 4
    fills_budget = False  # a cap for qa: whole sentences, the ones its evidence ranks high (README)

    def attention_readers(self, job: JobSpec) -> tuple[tuple[str, str], ...]:
        """The scorer reads when one is set (the generator only prefills the kept text)."""
        scorer = self.config(job).scorer
        return (("compression.scorer", scorer),) if scorer is not None else super().attention_readers(job)

    def reader_fix(self, job: JobSpec, field: str, name: str) -> str:
        """A generator that cannot read gets a scorer that can; a scorer, another one."""
        if field == "generation.model":
            return (f"set compression.scorer to a model of those types ({EMBEDDED_MODEL}: it reads, "
                    f"{shown(name)} only prefills the kept sentences)")
        return f"choose a scorer of those types ({EMBEDDED_MODEL})"

    def prefill_group_rows(self, job: JobSpec) -> int | None:
        """With a small scorer, 16 documents per pass on every device: its passes are
        launch-bound on a GPU, and on a CPU its narrow matmuls (and the generator's prefill
        of the kept text) run faster batched than one document at a time (the CPU 1B night,
        jobs/results/bench-job/README.md). The kept text's prefill stays within a few GB."""
        return 16 if self.config(job).scorer is not None else None

    def load(self, job: JobSpec, device: torch.device) -> Loaded:
        config = self.config(job)
        if config.scorer is None:
            return super().load(job, device)
        from stages.finch.scorer import load_scorer
        from stages.finch.spans import sentence_boundaries
        from stages.model_loading import load_causal_lm

        config = config.resolved(job.task.kind)
        model, tok = load_causal_lm(job.generation.model, job.generation.dtype, device)
        scorer = load_scorer(job, config, job.generation.dtype, device)
        similarity = prompt_similarity(config, tok, device)
        bounds = sentence_boundaries(tok)

        def prefill(parts: list[PromptParts], on_chunk: Callable[[], None] | None = None) -> CompressedPrefill:
            return scorer.prefill(model, tok, parts, bounds, similarity, on_chunk=on_chunk)

        return Loaded(model, tok, prefill, reading_chunk=config.chunk_tokens)


__all__ = ["SelectMethod", "warn_uncalibrated"]
