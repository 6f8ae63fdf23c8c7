"""What a compression method declares about itself: ``CompressionMethod``.

Contract: one module of stages/compression/ per method, holding the method's settings
model (a ``schemas.compression.CompressionSpec`` subclass) and one ``CompressionMethod``
subclass. The registry (stages/compression/__init__.py) finds the subclasses; the
spec, the plan, tokenize, generate, the eval, the bench and the docs read them, and
nobody else branches on method types.

Where a method runs (``runs_at``):
- ``"tokenize"``: a pure function of the document's token ids (``compress_ids``),
  cheap enough to ride along in the tokenize actor instead of costing a pool;
- ``"text_stage"``: its own actor pool before generate (``stage_class``: a Ray Data
  callable class taking ``spec=<JobSpec as JSON>``), ``resources.compress_actors``
  actors with ``resources.compress_num_gpus`` each when ``uses_compress_gpus``;
- ``"prefill"``: a prefill strategy inside the generate actor (``load``), because it
  needs the generating model's own weights (infra/README.md, "Architecture").
Text compression (tokenize, text_stage) adds ``context_ids``/``context_tokens``/
``compress_s``/``context_spans`` to the row (``CONTEXT_COLUMNS``, schemas/rows.CompressedRow); a prefill strategy reports
its ``context_tokens``/``compress_s`` through ``CompressedPrefill``.
Eval-only behaviour is not part of this contract: a method that conditions the eval's
LM scoring its own way implements the optional ``ConditionsContinuations``
(stages/compression/lm_scoring.py).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from schemas.compression import CompressionSpec
from schemas.spec import JobSpec

if TYPE_CHECKING:
    import torch

    from stages.decoding.state import CompressedPrefill
    from stages.prompting import PromptParts
    from stages.token_bytes import CharacterEdges

RunsAt = Literal["tokenize", "text_stage", "prefill"]
#: Where each ``runs_at`` runs, in the words of the README's method table.
WHERE: Mapping[str, str] = MappingProxyType(
    {"tokenize": "tokenize actor", "text_stage": "its own actor pool", "prefill": "generate actor"}
)
#: The row columns every text compression adds (schemas/rows.CompressedRow).
CONTEXT_COLUMNS = ("context_ids", "context_tokens", "compress_s", "context_spans")


def spans_of(positions: list[int]) -> list[int]:
    """Ascending document positions -> flattened half-open runs ``[s0, e0, s1, e1, ...]``
    (the output's ``kept_spans``). ``[3, 4, 5, 9]`` -> ``[3, 6, 9, 10]``; ValueError when
    the positions are not strictly ascending."""
    out: list[int] = []
    for p in positions:
        if out and p < out[-1]:
            raise ValueError(f"kept positions must be strictly ascending, got {p} after {out[-1] - 1}")
        if out and p == out[-1]:
            out[-1] = p + 1
        else:
            out += [p, p + 1]
    return out


def positions_of(spans: list[int]) -> list[int]:
    """Flattened ``[start, end)`` pairs -> the positions they cover, ascending."""
    return [p for s, e in zip(spans[::2], spans[1::2], strict=True) for p in range(s, e)]

Prefill = Callable[[list["PromptParts"]], "CompressedPrefill"]


@dataclass(frozen=True)
class Budget:
    """One setting that occupies context positions at the same time as other things.

    ``field``: its spec path (``compression.target_tokens``); ``value``: its tokens;
    ``alongside``: tokens of other settings held at the same moment (finch's
    ``chunk_tokens`` while it reads); ``frame``: whether the prompt's frame (template,
    instruction, question) is held too; ``generation``: whether
    ``generation.max_new_tokens`` is held too (the context the answer is decoded from).
    """

    field: str
    value: int
    alongside: int = 0
    frame: bool = True
    generation: bool = True
    why: str = ""

    def largest(self, context: int, frame_tokens: int, max_new_tokens: int) -> int:
        """The largest value of the field that fits ``context`` with what it is held beside."""
        return (context - self.alongside - (frame_tokens if self.frame else 0)
                - (max_new_tokens if self.generation else 0))


@dataclass(frozen=True)
class Loaded:
    """What a method hands the generate actor: the decoding model, its tokenizer and
    the prefill strategy (B prompts -> CompressedPrefill whose cache ``model`` decodes).

    ``full_prefill``: the strategy is the plain prefill of the whole prompt, which the
    decode engine does itself (chunked, straight into its KV slots) instead of calling
    ``prefill``. A method's own strategy may take an ``on_chunk`` keyword: a callable to
    invoke between its chunks, through which the engine keeps other rows decoding."""

    model: Any
    tokenizer: Any
    prefill: Prefill
    full_prefill: bool = False
    #: Document tokens ``prefill`` reads between two ``on_chunk`` calls (its chunk): the
    #: progress line's count of chunks to read; None when the strategy does not say.
    reading_chunk: int | None = None


class CompressionMethod(ABC):
    """One compression method. Stateless: the registry holds one instance per method.

    Class attributes (the declaration): ``name`` (= the spec's ``method``), ``spec_model``,
    ``summary`` (one line: what it keeps, for the docs), ``paper`` (link or None),
    ``order`` (display order: tables, eval runs), ``runs_at`` (see module docstring),
    ``needs``/``adds`` (row columns read before generate / added to the row),
    ``uses_compress_gpus`` (its pool takes resources.compress_num_gpus),
    ``reads_any_length`` (reads documents of any length chunk by chunk, so generate
    does not reject a document longer than the model's context), ``keeps_by_position`` (what
    it keeps is fixed by position: `validate` says what share of a long document the model
    sees), ``eval_budgeted``
    (``longdoc eval`` sweeps target_tokens for it), ``fills_budget`` (target_tokens is a
    quota: a row keeps exactly min(target_tokens, its document's tokens), where a cap keeps
    at most that: tests/stages/compression/test_methods.py holds it to it) and ``needs_checkpoint`` (the eval
    passes ``--autocompressor PATH`` as compression.checkpoint and runs it only then).
    """

    name: ClassVar[str]
    spec_model: ClassVar[type[CompressionSpec]]
    summary: ClassVar[str]
    paper: ClassVar[str | None] = None
    order: ClassVar[int] = 100
    runs_at: ClassVar[RunsAt]
    needs: ClassVar[tuple[str, ...]] = ()
    adds: ClassVar[tuple[str, ...]] = ()
    uses_compress_gpus: ClassVar[bool] = False
    reads_any_length: ClassVar[bool] = False
    #: What it keeps of a document is fixed by position (truncate's head and tail), not by
    #: its text or question: `validate` says what share of a long document the model sees.
    keeps_by_position: ClassVar[bool] = False
    eval_budgeted: ClassVar[bool] = False
    fills_budget: ClassVar[bool] = False
    needs_checkpoint: ClassVar[bool] = False

    # ------------------------------------------------------------------ every method
    def config(self, job: JobSpec) -> Any:
        """``job.compression``, checked to be this method's settings model."""
        if not isinstance(job.compression, self.spec_model):
            raise ValueError(
                f"{type(self).__name__} needs compression.method {self.name!r}, "
                f"got {job.compression.method!r}"
            )
        return job.compression

    def attention_readers(self, job: JobSpec) -> tuple[tuple[str, str], ...]:
        """(spec field, model name) of each model whose attention this method reads with
        Finch's machinery (stages/finch/support.py: a few architectures only), so the
        preflight can refuse another architecture before any model loads. None (``()``) by default."""
        return ()

    def problems(self, job: JobSpec) -> list[str]:
        """What this method can tell is wrong with ``job`` on this machine before any model
        loads (a checkpoint that is missing, unfinished or of another model), one line each
        naming the field and the fix; pipeline/model_checks.py asks it. None (``[]``) by default."""
        return []

    def reader_fix(self, job: JobSpec, field: str, name: str) -> str:
        """What to do when ``attention_readers``' model ``name`` (at spec ``field``) is of a
        model type Finch's machinery does not run on (pipeline/model_checks.py says it before
        any model loads)."""
        return "choose a model of those types"

    def peer_cut(self, config: Any) -> tuple[int, str] | None:
        """The context of ``config`` that the bench job's plain-transformers peer
        (pipeline/bench/peer.py ``--truncate-tokens N --keep K``: the document's head, tail or
        both ends) reproduces token for token, as ``(N, K)``; None (the default): the peer
        cannot keep what this method keeps, so it reads the whole document and the bench
        does not call the two contexts the same."""
        return None

    def tokenizer_source(self, job: JobSpec) -> str:
        """Name or path of the generating model's tokenizer (documents are counted in it)."""
        return job.generation.model

    def prefills_whole(self, job: JobSpec) -> bool:
        """It prefills each document whole (none): a document must fit the model's context
        with its prompt and answer (the tokenize stage fails one that does not; `validate`
        counts the first documents: pipeline/fits.py)."""
        return not (self.reads_any_length or self.budgets(job)) and self.runs_at == "prefill"

    def budgets(self, job: JobSpec) -> tuple[Budget, ...]:
        """What of the settings the model's context holds at once (stages/context_budget.py
        refuses, before any model loads, a budget that can never fit). Default: a
        ``target_tokens`` budget is the kept context, held with the prompt's frame and
        ``generation.max_new_tokens``; a method reading documents of any length declares
        what its reading holds as well (finch)."""

        target = getattr(self.config(job), "target_tokens", None)
        return (Budget("compression.target_tokens", int(target)),) if target else ()

    # ------------------------------------------------------------------ runs_at == "tokenize"
    def tokenizer_edges(self, tokenizer: Any) -> CharacterEdges:
        """What ``compress_spans`` reads of the tokenizer, built once per tokenize actor (and
        once per eval run): its character edges (``CharacterEdges.of``, ~0.15 s). A method that
        needs more of the tokenizer (where sentences or paragraphs end) returns a
        ``CharacterEdges`` subclass carrying it: the tokenize stage and the eval pass it on
        untouched, so such a method is still one module."""
        from stages.token_bytes import CharacterEdges

        return CharacterEdges.of(tokenizer)

    def compress_spans(self, config: Any, doc_ids: list[int], edges: CharacterEdges) -> list[int]:
        """Where the kept context sits in ``doc_ids``: flattened ``[start, end)`` pairs
        (``spans_of``), at most the budget; no cut inside a character (``edges``: this
        method's ``tokenizer_edges``, stages/token_bytes.py). The one thing a tokenize method defines."""
        raise NotImplementedError(f"{self.name} runs at {self.runs_at}, not in tokenize")

    def compress_ids(self, config: Any, doc_ids: list[int], edges: CharacterEdges) -> list[int]:
        """The context ids kept of ``doc_ids`` (a subsequence): ``compress_spans``' tokens."""
        return [doc_ids[p] for p in positions_of(self.compress_spans(config, doc_ids, edges))]

    # ------------------------------------------------------------------ runs_at == "text_stage"
    def stage_class(self) -> type:
        """Ray Data callable class: ``__init__(spec: dict)``, ``__call__(batch) -> batch``."""
        raise NotImplementedError(f"{self.name} runs at {self.runs_at}, not as a text stage")

    # ------------------------------------------------------------------ generate actor
    def load(self, job: JobSpec, device: torch.device) -> Loaded:
        """Load the generating model and this method's prefill strategy on ``device``.

        Default (text compression or none): ``generation.model`` and a full prefill of
        ``prefix + context + query``, where the context is already what the method kept.
        """
        from stages.decoding.state import CompressedPrefill, prefill_full
        from stages.model_loading import load_causal_lm

        model, tok = load_causal_lm(job.generation.model, job.generation.dtype, device)
        pad = tok.pad_token_id

        def full(parts: list[PromptParts]) -> CompressedPrefill:
            state = prefill_full(model, [p.full_ids for p in parts], pad)
            return CompressedPrefill(
                state=state,
                context_tokens=[len(p.context_ids) for p in parts],
                compress_s=[0.0] * len(parts),
            )

        return Loaded(model, tok, full, full_prefill=True)

    def prefill_group_rows(self, job: JobSpec) -> int | None:
        """Requests one call of this method's prefill may take, on any backend (None: the
        backend's default, one on CPU). A method whose reading gains from wider passes (a
        small scorer model: launch-bound on a GPU, narrow matmuls on a CPU) asks for more,
        so each pass reads many documents."""
        return None

    def reads_once_per_document(self, job: JobSpec) -> bool:
        """True: this method's prefill reads a document once for all the rows given to one
        call (Finch's chunk reading), so the engine hands it a document's queued requests
        together (stages/decoding/request.py ``Request.doc_key``)."""
        return False

    def kv_tokens(self, job: JobSpec, parts: PromptParts) -> int | None:
        """KV slots a request holds after this method's prefill (for the engine's admission
        by memory); None: the whole prompt (``len(parts)``), right for text methods."""
        return None

    def expected_kv_tokens(self, job: JobSpec) -> int:
        """KV slots a typical request holds after the prefill: the engine's first slot size.

        Budgeted methods: the budget plus room for the chat template and question; else
        the model's usual document, unknown here: 2048 (the engine relays out its slots
        when a longer row comes, within the same memory).
        """
        target = getattr(job.compression, "target_tokens", None)
        return int(target) + 192 if target else 2048
