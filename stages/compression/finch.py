"""Method ``finch``: prompt-guided KV-cache compression by chunked prefill.

Finch (Corallo & Papotti, TACL 2024, https://arxiv.org/abs/2408.00167) reads the
document chunk by chunk and keeps, per layer, the KV entries the question attends to
most: exactly ``min(target_tokens, len(doc))`` of them. It needs the generating
model's own weights, so it runs as a prefill strategy inside the generate actor and
reads documents of any length (``reads_any_length``). This module only declares the
method and its settings; the algorithm is the stages/finch/ package.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from schemas.compression import CompressionSpec
from schemas.spec import EMBEDDED_EMBEDDER, JobSpec
from stages.compression.base import CompressionMethod, Loaded
from stages.compression.lm_scoring import Condition, ConditionsContinuations

# Finch's min_relevance for qa (auto): kept sentences scoring below this fraction of the
# best one are dropped. Chosen among 0 / 0.3 / 0.5 on the eval set (0.3 and 0.5 tied) and
# the held-out sets broke the tie (jobs/eval/results/2026-11-24-finch-relevance-floor-cpu.md).
AUTO_MIN_RELEVANCE = 0.5
# Finch's fused evidence for qa: weight of the embedder's sentence similarity, and how
# sentences are cut. Chosen on the tuning part of the eval (jobs/eval/qa-tuning.jsonl).
AUTO_SIMILARITY_WEIGHT = 0.5
AUTO_SENTENCE_SPLIT = "prose"
# Each chosen sentence brings the next one of its paragraph: with the relevance floor Finch
# reads about one sentence, and where the answer follows the sentence that names its
# subject (two-sentence questions) that sentence alone cannot answer. On the tuning part at
# 512: two-sentence 0.125 -> 0.625, echoed 0.778 both, paraphrased 0.464 -> 0.429 (one
# question of 28, the answer in the read text in both), 9 more tokens read
# (jobs/eval/results/2026-11-26-finch-next-sentence-tuning-512-cpu.md).
AUTO_NEXT_SENTENCE = True

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from stages.context_budget import Budget
    from stages.decoding.state import CompressedPrefill
    from stages.prompting import PromptParts


class FinchCompression(CompressionSpec):
    """Keep the KV entries the question attends to most, read chunk by chunk."""

    method: Literal["finch"] = "finch"
    fingerprint_omits_default = ("max_scoring_layers",)  # added 2026-11-26
    target_tokens: int = Field(
        default=1024, ge=1, description="Exact KV-cache budget (document tokens kept per layer)."
    )
    chunk_tokens: int = Field(
        default=512, ge=16, description="Document tokens read per chunked-prefill step."
    )
    head_mode: Literal["sum", "kv_group"] = Field(
        default="sum",
        description="sum: one selection from attention summed over the scoring heads; "
        "kv_group: a separate selection per KV head group (GQA; mode kv only).",
    )
    scoring: Literal["heads", "paper"] = Field(
        default="heads",
        description="heads: the model's calibrated retrieval heads (`longdoc calibrate-heads`; "
        "all heads when uncalibrated), each normalised, pooled over pool_window tokens; "
        "paper: the Finch paper's attention summed over every head, per layer, no pooling.",
    )
    pool_window: int = Field(
        default=7, ge=1, description="scoring heads: scores averaged over this many tokens, "
        "so whole spans are kept rather than scattered tokens (1 = no pooling).",
    )
    selection: Literal["shared", "per_layer"] = Field(
        default="shared",
        description="scoring heads: shared = one selection for every layer; per_layer = each "
        "layer ranks by its own heads (mode kv only).",
    )
    max_scoring_layers: int | None = Field(
        default=None, ge=1,
        description="scoring heads, selection shared: only heads in the model's first N layers "
        "select (the calibrated ones there, or every head of those layers when none is), so "
        "early exit reads each document through N layers, not the model's depth; a model "
        "without calibrated heads otherwise reads it through every layer and then prefills "
        "the kept tokens again, more than no compression costs (GemFilter selects with one "
        "early layer: index 13 of Llama-3.1-8B's 32). null: no cap.",
    )
    mode: Literal["kv", "early_exit"] = Field(
        default="early_exit",
        description="kv: keep the selected KV entries of every layer; early_exit: read the "
        "document only through the layers up to the last scoring layer, then prefill the "
        "kept tokens through the whole model (GemFilter). Needs scoring heads, selection shared.",
    )

    keep: Literal["auto", "tokens", "sentences"] = Field(
        default="auto",
        description="sentences (mode early_exit): whole sentences around the selected tokens, "
        "best-scored first (the answer often follows the words matching the question); "
        "tokens: the selected tokens; auto: sentences in mode early_exit, tokens in mode kv.",
    )

    order: Literal["auto", "document", "relevance"] = Field(
        default="auto",
        description="relevance (mode early_exit): kept sentences (or runs) least relevant first, "
        "so the best evidence ends next to the question (small models read what is nearest); "
        "document: document order; auto: relevance for task.kind qa, document for summaries "
        "(and in mode kv).",
    )

    min_relevance: Annotated[float, Field(ge=0, lt=1)] | Literal["auto"] = Field(
        default="auto",
        description="mode early_exit: keep only the sentences (or runs) whose best score is at "
        "least this fraction of the best one's, so a question whose evidence is concentrated "
        "reads a few sentences rather than the whole budget (target_tokens stays the cap; a "
        "document within it is read whole); 0 fills the budget; auto: "
        f"{AUTO_MIN_RELEVANCE} for task.kind qa, 0 for summaries (and in mode kv).",
    )

    evidence: Literal["auto", "heads", "fused"] = Field(
        default="auto",
        description="keep sentences (mode early_exit): which sentences the model reads. heads: the "
        "retrieval heads' scores of the chunked pass; fused: those scores fused per sentence with "
        "the embedder's similarity between the question and the sentence, so a question that asks "
        "in other words than the document still finds its sentence; auto: fused for task.kind qa, "
        "heads for summaries.",
    )
    embedder: str = Field(
        default=EMBEDDED_EMBEDDER,
        description="evidence fused: sentence-transformers model (id, path or the embedded one).",
    )
    similarity_weight: float = Field(
        default=AUTO_SIMILARITY_WEIGHT, ge=0, le=1,
        description="evidence fused: weight of the embedder's similarity next to the heads' score "
        "(0 = heads only, 1 = the embedder only).",
    )
    next_sentence: bool = Field(
        default=AUTO_NEXT_SENTENCE,
        description="evidence fused: each chosen sentence brings the next sentence of its paragraph "
        "along (within the budget): an answer often follows the sentence that names its subject.",
    )
    sentence_split: Literal["lines", "prose"] = Field(
        default=AUTO_SENTENCE_SPLIT,
        description="keep sentences: lines = every line break ends a sentence; prose = a line "
        "wrapped inside a paragraph goes on (hard-wrapped text read in whole sentences; code "
        "lines and blank lines still end one).",
    )

    def resolved(self, task_kind: str) -> FinchCompression:
        """These settings with ``auto`` resolved for a job of ``task_kind`` (qa | summarize).

        The method resolves them when it loads; ``finch_prefill`` called directly reads
        keep auto as tokens and order auto as document (it has no tokenizer to find
        sentences with, and does not know the task)."""
        early = self.mode == "early_exit"
        keep = self.keep if self.keep != "auto" else ("sentences" if early else "tokens")
        order = self.order
        if order == "auto":
            order = "relevance" if early and task_kind == "qa" else "document"
        floor = self.min_relevance
        if floor == "auto":
            floor = AUTO_MIN_RELEVANCE if early and task_kind == "qa" else 0.0
        evidence = self.evidence
        if evidence == "auto":
            evidence = "fused" if keep == "sentences" and task_kind == "qa" else "heads"
        return self.model_copy(update={"keep": keep, "order": order, "min_relevance": floor,
                                       "evidence": evidence})

    @property
    def relevance_floor(self) -> float:
        """min_relevance as a number (auto, unresolved, reads as 0: fill the budget)."""
        return 0.0 if self.min_relevance == "auto" else float(self.min_relevance)

    @model_validator(mode="after")
    def _chunk_fits(self) -> FinchCompression:
        if self.chunk_tokens < 16:
            raise ValueError("chunk_tokens must be >= 16")
        if self.mode == "early_exit" and (
            self.scoring != "heads" or self.selection != "shared" or self.head_mode != "sum"
        ):
            raise ValueError(
                f"mode early_exit keeps one token selection: it needs scoring heads, selection "
                f"shared and head_mode sum (got scoring {self.scoring}, selection "
                f"{self.selection}, head_mode {self.head_mode}); set mode: kv for the others"
            )
        if self.max_scoring_layers is not None and (self.scoring != "heads" or self.selection != "shared"):
            raise ValueError(
                f"max_scoring_layers caps the layers of the selecting heads: it needs scoring heads and "
                f"selection shared (got scoring {self.scoring}, selection {self.selection}); allowed: "
                f"max_scoring_layers null with those"
            )
        if self.order == "relevance" and self.mode != "early_exit":
            raise ValueError(f"order relevance needs mode early_exit (got mode {self.mode}); allowed: order document")
        if self.relevance_floor > 0 and self.mode != "early_exit":
            raise ValueError(f"min_relevance needs mode early_exit (got mode {self.mode}); allowed: min_relevance 0")
        if self.keep == "sentences" and self.mode != "early_exit":
            raise ValueError(f"keep sentences needs mode early_exit (got mode {self.mode}); allowed: keep tokens")
        if self.evidence == "fused" and (self.mode != "early_exit" or self.keep == "tokens"):
            raise ValueError(
                f"evidence fused scores whole sentences: it needs mode early_exit and keep sentences "
                f"(got mode {self.mode}, keep {self.keep}); allowed: evidence heads"
            )
        return self


class FinchMethod(CompressionMethod, ConditionsContinuations):
    name = "finch"
    spec_model = FinchCompression
    summary = "the sentences the question's retrieval heads attend to most, read chunk by chunk (for qa only the strongest, best evidence last)"
    paper = "https://arxiv.org/abs/2408.00167"
    order = 3
    runs_at = "prefill"
    needs = ("doc_ids", "question", "instruction")
    reads_any_length = True
    eval_budgeted = True

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

        return Loaded(model, tok, prefill)

    def budgets(self, job: JobSpec) -> tuple[Budget, ...]:
        """Reading holds the kept tokens and the next chunk with the prompt (stages.finch
        ``check_inputs``); decoding holds the kept tokens with the prompt and the answer."""
        from stages.context_budget import Budget

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
    costs in mode early_exit; True when it said so. ``config`` resolved."""
    if config.scoring != "heads" or config.mode != "early_exit" or config.max_scoring_layers is not None:
        return False
    from stages.finch.heads import find_heads

    if find_heads(model) is not None:
        return False
    layers = int(model.config.get_text_config().num_hidden_layers)
    log.warning(
        "finch: %s has no calibrated retrieval heads, so every head of all %d layers selects and each "
        "document is read through the whole model before its kept tokens are prefilled again (more "
        "prefill than method none). `longdoc calibrate-heads --model %s` finds the heads once per "
        "model; compression.max_scoring_layers caps the layers read instead.", name, layers, name,
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
