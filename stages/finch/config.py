"""Finch's settings (the algorithm is this package; stages/compression/finch.py and
select.py declare the methods that use them).

``FinchCompression`` (method ``finch``) defaults to the Finch paper (Corallo & Papotti,
TACL 2024): every layer keeps the KV entries its heads' attention from the question
chooses, chunk by chunk, and those entries are the answer's cache. ``SelectCompression``
(method ``select``) is the project's text selection built on the same reading pass:
early exit through the layers of the calibrated retrieval heads, whole sentences chosen
by the heads' evidence fused with an embedder's similarity, then only those sentences
are prefilled, optionally read by a smaller ``scorer`` model than the generator.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from schemas.compression import CompressionSpec
from schemas.spec import EMBEDDED_EMBEDDER

# Finch's min_relevance for qa (auto): kept sentences scoring below this fraction of the
# best one are dropped. Chosen among 0 / 0.3 / 0.5 on the eval set (0.3 and 0.5 tied) and
# the held-out sets broke the tie (jobs/eval/results/2026-11-24-finch-relevance-floor-cpu.md).
AUTO_MIN_RELEVANCE = 0.5
# The floor of the reading once for all questions (reading: chunk, select's default). A chunk
# read without the question's kept entries before it scores more sentences near the best
# one, so at the per-question reading's 0.5 it kept twice the text (84 tokens on the tuning
# part at 1024) and the reader answered fewer questions. Chosen among 0.5 / 0.6 / 0.7 / 0.8
# on the tuning part at 1024 and 512
# (jobs/eval/results/2026-11-29-smollm2-135m-qa-tuning-select-chunk-relevance-floor-cpu.md).
AUTO_MIN_RELEVANCE_CHUNK = 0.7
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
#: The model types whose attention Finch's reading captures and moves (stages/finch/support.py
#: says why); here, without torch, so the preflight can name another one before a model loads.
FINCH_MODEL_TYPES = ("llama", "mistral", "qwen2")

class FinchCompression(CompressionSpec):
    """Finch's settings; the defaults are the paper's (mode kv, scoring paper, reading kept)."""

    method: Literal["finch"] = "finch"
    fingerprint_omits_default = ("max_scoring_layers", "reading", "share_reading", "heads_from")
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
        default="paper",
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
    heads_from: str | None = Field(
        default=None,
        description="scoring heads: select with the heads calibrated on this model (a shipped "
        "set, e.g. embedded:smollm2-135m-instruct) instead of the model's own: for a fine-tune "
        "of that model, or a random-weight stand-in of its architecture in benchmarks. null: "
        "the model's own calibrated heads (every head when it has none).",
    )
    mode: Literal["kv", "early_exit"] = Field(
        default="kv",
        description="kv: keep the selected KV entries of every layer; early_exit: read the "
        "document only through the layers up to the last scoring layer, then prefill the "
        "kept tokens through the whole model (GemFilter). Needs scoring heads, selection shared.",
    )

    reading: Literal["kept", "chunk"] = Field(
        default="kept",
        description="kept (the paper): each chunk is read after the entries its question kept "
        "so far, so a document's questions each read it; chunk: each chunk is read after the "
        "prompt's prefix and the document's text just before it (chunk_context), not after a "
        "question's entries, so a document is read once for all its questions "
        "(stages/finch/shared.py); on our eval it kept the answer's sentence as often and "
        "answered a question or two fewer of 80.",
    )
    chunk_context: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default="auto",
        description="reading chunk: each chunk is read after the prompt's prefix and the "
        "document's last N tokens before it (question-independent, so the document is still "
        "read once; their keys and values come from the pass before), so in mode kv the kept "
        "entries were read with text before them; 0: after the prefix only. auto: one chunk "
        "(chunk_tokens) in mode kv, whose kept entries are the answer's cache; 0 in mode "
        "early_exit, which prefills the kept text again.",
    )
    share_reading: bool = Field(
        default=True,
        description="reading chunk: the engine hands a document's queued questions to one "
        "reading pass (false: one pass per question; the same answers, for comparison).",
    )

    keep: Literal["auto", "tokens", "sentences"] = Field(
        default="auto",
        description="sentences: whole sentences around the selected tokens, best-scored first "
        "(the answer often follows the words matching the question); in mode early_exit their "
        "text is prefilled, in mode kv (scoring heads, selection shared) each chunk pass keeps "
        "the KV entries of whole sentences, each ranked by its best token; tokens: the selected "
        "tokens; auto: sentences in mode early_exit, tokens in mode kv.",
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
        "document within it is read whole); mode kv with keep sentences: the same floor on the "
        "kept sentences' entries after the last pass (the answer's cache holds fewer entries); "
        "0 fills the budget; auto: "
        f"{AUTO_MIN_RELEVANCE} for task.kind qa ({AUTO_MIN_RELEVANCE_CHUNK} with reading chunk), "
        "0 for summaries and in mode kv (the paper's exact budget).",
    )

    evidence: Literal["auto", "heads", "fused"] = Field(
        default="auto",
        description="keep sentences (mode early_exit): which sentences the model reads. heads: the "
        "retrieval heads' scores of the chunked pass; fused: those scores fused per sentence with "
        "the embedder's similarity between the question and the sentence, so a question that asks "
        "in other words than the document still finds its sentence; auto: fused for task.kind qa "
        "in mode early_exit, heads for summaries and in mode kv.",
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
        "along (within the budget): an answer often follows the sentence that names its subject; "
        "mode kv with min_relevance: a kept sentence right after one above the floor stays.",
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
            qa_floor = AUTO_MIN_RELEVANCE_CHUNK if self.reading == "chunk" else AUTO_MIN_RELEVANCE
            floor = qa_floor if early and task_kind == "qa" else 0.0
        evidence = self.evidence
        if evidence == "auto":  # fused is early exit's (mode kv loads no embedder: the paper's frame)
            evidence = "fused" if early and keep == "sentences" and task_kind == "qa" else "heads"
        return self.model_copy(update={"keep": keep, "order": order, "min_relevance": floor,
                                       "evidence": evidence})

    @property
    def reading_context(self) -> int:
        """chunk_context as a number of tokens (auto resolved; 0 unless reading chunk)."""
        if self.reading != "chunk":
            return 0
        if self.chunk_context == "auto":
            return self.chunk_tokens if self.mode == "kv" else 0
        return int(self.chunk_context)

    def fingerprint_settings(self) -> dict[str, Any]:
        """The base's, with the chunk context in tokens where the reading uses one: ``auto``
        resolves differently by mode and chunk size, and the runs from before it existed read
        without one."""
        settings = super().fingerprint_settings()
        settings.pop("chunk_context", None)
        if self.reading_context:
            settings["chunk_context"] = self.reading_context
        return settings

    @property
    def relevance_floor(self) -> float:
        """min_relevance as a number (auto, unresolved, reads as 0: fill the budget)."""
        return 0.0 if self.min_relevance == "auto" else float(self.min_relevance)

    @model_validator(mode="after")
    def _chunk_fits(self) -> FinchCompression:
        if self.chunk_tokens < 16:
            raise ValueError("chunk_tokens must be >= 16")
        if self.chunk_context not in ("auto", 0) and self.reading != "chunk":
            raise ValueError(
                f"chunk_context is the document text a chunk is read after in reading chunk (got reading "
                f"{self.reading}, whose chunks are read after the question's kept entries); allowed: "
                f"chunk_context 0, or reading chunk"
            )
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
        if self.relevance_floor > 0 and self.mode != "early_exit" and self.keep != "sentences":
            raise ValueError(
                f"min_relevance needs mode early_exit, or keep sentences in mode kv (got mode {self.mode}, "
                f"keep {self.keep}); allowed: min_relevance 0"
            )
        if self.keep == "sentences" and self.mode == "kv" and (
            self.scoring != "heads" or self.selection != "shared" or self.head_mode != "sum"
        ):
            raise ValueError(
                f"keep sentences in mode kv ranks whole sentences in one selection for every layer: it "
                f"needs scoring heads, selection shared and head_mode sum (got scoring {self.scoring}, "
                f"selection {self.selection}, head_mode {self.head_mode}); allowed: keep tokens"
            )
        if self.evidence == "fused" and (self.mode != "early_exit" or self.keep == "tokens"):
            raise ValueError(
                f"evidence fused scores whole sentences: it needs mode early_exit and keep sentences "
                f"(got mode {self.mode}, keep {self.keep}); allowed: evidence heads"
            )
        return self


class SelectCompression(FinchCompression):
    """Read the document once through the retrieval heads' layers; prefill only the sentences
    they (and the embedder) pick."""

    method: Literal["select"] = "select"  # type: ignore[assignment]
    fingerprint_omits_default = ()
    scoring: Literal["heads", "paper"] = Field(
        default="heads", description="heads: the calibrated retrieval heads select (the only choice of select)."
    )
    mode: Literal["kv", "early_exit"] = Field(
        default="early_exit",
        description="early_exit: the document is read only through the layers up to the last "
        "selecting head, then the kept sentences are prefilled (the only mode of select).",
    )
    reading: Literal["kept", "chunk"] = Field(
        default="chunk",
        description="chunk (default): each chunk is read after the prompt's prefix only, so a "
        "document is read once for all its questions; kept: after the question's kept entries.",
    )
    scorer: str | None = Field(
        default=None,
        description="the model that reads the document and selects (id, path or the shipped "
        "embedded:smollm2-135m-instruct with its calibrated heads); null: the generating model's "
        "own early layers. Selection is in sentences, so the scorer need not share the "
        "generator's tokenizer; target_tokens counts the generator's tokens.",
    )

    @model_validator(mode="after")
    def _select_frame(self) -> SelectCompression:
        if self.mode != "early_exit":
            raise ValueError(
                "select reads through the selecting heads' layers and prefills the kept text "
                f"(mode early_exit); got mode {self.mode}: for kept KV entries use method finch"
            )
        return self
