"""Method ``finch``: prompt-guided KV-cache compression by chunked prefill.

Finch (Corallo & Papotti, TACL 2024, https://arxiv.org/abs/2408.00167) reads the
document chunk by chunk with the question appended to each chunk and keeps, per layer,
the KV entries the question's attention chooses: exactly ``min(target_tokens,
len(doc))`` of them, which are the cache the answer is generated from. By default it
runs the paper's frame (mode kv, scoring paper, each chunk read after the kept
entries); the settings (stages/finch/config.py) name the variants. It needs the
generating model's own weights, so it runs as a prefill strategy inside the generate
actor and reads documents of any length (``reads_any_length``). This module only
declares the method; the algorithm is the stages/finch/ package.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from schemas.spec import EMBEDDED_MODEL, JobSpec
from stages.compression.base import CompressionMethod, Loaded
from stages.compression.lm_scoring import Condition, ConditionsContinuations
from stages.finch.config import (  # noqa: F401 - re-exported: the settings' old home
    AUTO_MIN_RELEVANCE,
    AUTO_NEXT_SENTENCE,
    AUTO_SENTENCE_SPLIT,
    AUTO_SIMILARITY_WEIGHT,
    FinchCompression,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from stages.compression.base import Budget
    from stages.decoding.state import CompressedPrefill
    from stages.prompting import PromptParts


class FinchMethod(CompressionMethod, ConditionsContinuations):
    name = "finch"
    spec_model = FinchCompression
    summary = "the KV entries the question's attention picks in every layer, read chunk by chunk, kept as the answer's cache (the paper)"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 3
    runs_at = "prefill"
    needs = ("doc_ids", "question", "instruction")
    reads_any_length = True
    eval_budgeted = True
    fills_budget = True

    def load(self, job: JobSpec, device: torch.device) -> Loaded:
        from stages.finch import check_supported, finch_prefill
        from stages.finch.spans import sentence_boundaries
        from stages.model_loading import load_causal_lm

        config = self.config(job).resolved(job.task.kind)
        model, tok = load_causal_lm(job.generation.model, job.generation.dtype, device)
        check_supported(model)  # an unsupported architecture fails at actor start, not per row
        warn_uncalibrated(model, job.generation.model, config)
        pad = tok.pad_token_id
        bounds = sentence_boundaries(tok) if config.keep == "sentences" else None
        similarity = prompt_similarity(config, tok, device)
        def prefill(parts: list[PromptParts], on_chunk: Callable[[], None] | None = None) -> CompressedPrefill:
            return finch_prefill(model, parts, config, pad, boundaries=bounds, similarity=similarity,
                                 on_chunk=on_chunk)

        return Loaded(model, tok, prefill, reading_chunk=config.chunk_tokens)

    def attention_readers(self, job: JobSpec) -> tuple[tuple[str, str], ...]:
        """The generator reads (its kept keys and values are the answer's cache)."""
        return (("generation.model", job.generation.model),)

    def reader_fix(self, job: JobSpec, field: str, name: str) -> str:
        """The generator is the reader here: select with a small scorer keeps it."""
        return f"use select with compression.scorer: {EMBEDDED_MODEL}"

    def reads_once_per_document(self, job: JobSpec) -> bool:
        """The engine hands a document's queued questions to one prefill call: reading
        chunk (question-independent) with share_reading on."""
        config = self.config(job)
        return config.reading == "chunk" and config.share_reading

    def budgets(self, job: JobSpec) -> tuple[Budget, ...]:
        """Reading holds the kept tokens and the next chunk with the prompt (stages.finch
        ``check_inputs``); decoding holds the kept tokens with the prompt and the answer."""
        from stages.compression.base import Budget

        config = self.config(job)
        return (
            Budget("compression.target_tokens", config.target_tokens),
            Budget("compression.target_tokens", config.target_tokens, alongside=config.chunk_tokens,
                   generation=False, why="compression.chunk_tokens (the chunk read next to the kept tokens)"),
        )

    def kv_tokens(self, job: JobSpec, parts: PromptParts) -> int | None:
        """The prompt around the document plus at most ``target_tokens`` of it (the cap)."""
        target = self.config(job).resolved(job.task.kind).target_tokens
        return len(parts.prefix_ids) + min(target, len(parts.context_ids)) + len(parts.query_ids)

    def scoring_condition(self, job: JobSpec, device: torch.device) -> tuple[Loaded, Condition]:
        """LM scoring: Finch's question sits in its cache, so the query (the last
        ``query_tokens`` of the earlier text) is Finch's question, kept whole and counted
        in the budget, and the rest of the earlier text is compressed to
        ``target_tokens - query_tokens``: the cache is [start ; kept ; query], the
        continuation follows the query as it follows the text. A budget that holds the
        whole earlier text gives the full-context state."""
        from stages.decoding.state import CompressedPrefill
        from stages.finch import finch_prefill
        from stages.finch.spans import sentence_boundaries
        from stages.prompting import PromptParts

        heads_job = job.model_copy(update={"compression": self.config(job).model_copy(update={"evidence": "heads"})})
        loaded = self.load(heads_job, device)  # no embedder: LM scoring reads the heads' evidence
        config = self.config(heads_job).resolved(job.task.kind)
        keep = config.target_tokens
        pad = loaded.tokenizer.pad_token_id
        bounds = sentence_boundaries(loaded.tokenizer) if config.keep == "sentences" else None

        def condition(start_ids: list[int], earlier_ids: list[int], query_tokens: int) -> CompressedPrefill:
            if not 1 <= query_tokens < min(keep, len(earlier_ids)):
                raise ValueError(
                    f"finch scoring: query_tokens {query_tokens} must be >= 1 and below target_tokens "
                    f"{keep} and the earlier text's {len(earlier_ids)} tokens"
                )
            doc, query = list(earlier_ids[:-query_tokens]), list(earlier_ids[-query_tokens:])
            # The continuation follows the text it continues: document order always, the
            # whole budget, and the heads' evidence (the query is text, not a question an
            # embedder could match a sentence to).
            cfg = config.model_copy(update={"target_tokens": keep - query_tokens, "order": "document",
                                            "min_relevance": 0.0})
            res = finch_prefill(loaded.model, [PromptParts(list(start_ids), doc, query)], cfg, pad,
                                boundaries=bounds)
            return CompressedPrefill(res.state, [res.context_tokens[0] + query_tokens], res.compress_s)

        return loaded, condition


def warn_uncalibrated(model, name: str, config: FinchCompression) -> bool:
    """Say (once per load) that ``model`` has no calibrated retrieval heads and what that
    costs (mode early_exit: the reading; mode kv: a vote of every head, less focused);
    True when it said so. ``config`` resolved."""
    if config.scoring != "heads" or config.heads_from:
        return False
    if config.mode == "early_exit" and config.max_scoring_layers is not None:
        return False  # the layers read are capped: the cost said below is not paid
    from stages.finch.heads import find_heads

    if find_heads(model) is not None:
        return False
    layers = int(model.config.get_text_config().num_hidden_layers)
    cost = ("each document is read through the whole model before its kept tokens are prefilled again (more "
            "prefill than method none); compression.max_scoring_layers caps the layers read instead"
            if config.mode == "early_exit" else
            "the choice is every head's vote, not the few heads that find facts")
    log.warning(
        "finch: %s has no calibrated retrieval heads, so every head of all %d layers selects: %s. "
        "`longdoc calibrate-heads --model %s` finds the heads once per model.", name, layers, cost, name,
    )  # fmt: skip
    return True


def prompt_similarity(config: FinchCompression, tokenizer, device: torch.device):
    """The question-sentence similarity ``finch_prefill`` needs for ``evidence: fused``
    (stages.finch.fusion.make_similarity over ``config.embedder``, loaded on ``device``);
    None for evidence heads. ``config`` resolved (FinchCompression.resolved)."""
    if config.evidence != "fused":
        return None
    from stages.embedding import load_embedder
    from stages.finch.fusion import make_similarity

    return make_similarity(load_embedder(config.embedder, device), tokenizer)
