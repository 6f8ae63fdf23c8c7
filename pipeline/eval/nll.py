"""Continuation NLL for `longdoc eval --metrics nll`: the AutoCompressor paper's LM metric.

What is measured (Chevalier et al., 2023, https://arxiv.org/abs/2305.14788): the mean
negative log-likelihood per token (nats) of a document's continuation given its earlier
text compressed to B tokens, by teacher forcing one model on top of the conditioned state.

Contract:
- ``split_document(ids, C, max_earlier)``: the continuation is the document's last C
  tokens, the earlier text the tokens before it, capped to the last ``max_earlier`` (so
  that the full-context row fits the model's window: max_position_embeddings - C - start).
  Every method sees the same split (same tokenizer -> same ids).
- Conditioning is pipeline.eval.conditioning.condition_for (the method's own
  ``ConditionsContinuations`` if it implements one, else the default; nobody here
  branches on method types): a start token
  (BOS, else EOS; kept whole, not counted) plus the earlier text compressed at the run's
  settings. ``none`` is the whole earlier text (full context); the reference row
  ``no-context`` (this module) conditions on the start token only.
- The query. LM scoring has no question: the paper conditions on earlier text only.
  Query-guided methods (rag, bm25, finch) get the text of the earlier text's last
  ``query_tokens`` tokens (default 32, about one sentence): it is what the continuation
  follows, it is part of the conditioning text every method may keep (so it leaks
  nothing of the target, unlike the continuation's own first tokens would), and unlike a
  fixed instruction it says what the next text is about. Finch keeps it whole in its
  cache, inside its budget (stages/compression/finch.py).
- ``continuation_nll(model, state, cont)`` -> [C] float32 per-token NLL: token 0 from the
  state's ``last_logits``, tokens 1..C-1 from one ``forward_step`` over cont[:-1].
- ``run_nll`` -> one scored row per (run, document): task "nll", method, target_tokens,
  doc_id, nll, doc_tokens (earlier text), context_tokens, compression_ratio
  (doc_tokens / context_tokens), compress_s, e2e_s (condition + score seconds), error.
  A failure is a row with ``error`` set (a run that cannot load: one per document).
- ``aggregate_nll`` -> one summary per (method, budget), ``no-context`` first, with
  ``gap_recovered`` = (NLL_no-context - NLL) / (NLL_no-context - NLL_none), the share
  of the full context's gain kept. NLL and costs average over successful rows, but for
  ``compression_ratio``: sum(doc_tokens) / sum(context_tokens) of those rows
  (pipeline/eval/table.py ``aggregate_ratio``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.eval.conditioning import condition_for
from pipeline.eval.specs import EvalRun
from pipeline.eval.table import aggregate_ratio
from stages.compression import method_for, registry

if TYPE_CHECKING:  # torch loads only when NLL is computed: the CLI stays light
    import torch

    from stages.decoding.state import PrefillState

DEFAULT_NLL_BUDGETS = (128, 256, 512)
DEFAULT_CONTINUATION = 128
DEFAULT_QUERY_TOKENS = 32
NO_CONTEXT = "no-context"


def read_eval_documents(eval_set: str, limit: int | None = None) -> list[tuple[str, str]]:
    """(id, text) of the eval set's documents (JSONL fields id, text), first ``limit``."""
    import fsspec

    docs: list[tuple[str, str]] = []
    with fsspec.open(eval_set, "r", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                docs.append((str(rec.get("id")), str(rec.get("text") or "")))
            if limit is not None and len(docs) >= limit:
                break
    return docs


def start_ids(tokenizer) -> list[int]:
    """One start token: BOS, else EOS (GPT-2 style); the no-context row conditions on it."""
    tid = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if tid is None:
        raise ValueError("the tokenizer has neither a BOS nor an EOS token to start from")
    return [int(tid)]


def split_document(ids: Sequence[int], continuation_tokens: int, max_earlier: int) -> tuple[list[int], list[int]]:
    """(earlier, continuation): the last C tokens, and up to ``max_earlier`` before them."""
    if continuation_tokens < 1 or max_earlier < 1:
        raise ValueError(f"continuation_tokens and max_earlier must be >= 1, got {continuation_tokens}, {max_earlier}")
    if len(ids) <= continuation_tokens:
        raise ValueError(f"document has {len(ids)} tokens; needs more than continuation_tokens {continuation_tokens}")
    cut = len(ids) - continuation_tokens
    return list(ids[max(0, cut - max_earlier) : cut]), list(ids[cut:])


def continuation_nll(model, state: PrefillState, continuation: Sequence[int]) -> torch.Tensor:
    """Per-token NLL [C] (float32, nats) of ``continuation`` on top of a batch-1 ``state``."""
    import torch

    if state.batch_size != 1 or not continuation:
        raise ValueError("continuation_nll scores one row with a non-empty continuation")
    with torch.inference_mode():
        return _continuation_nll(model, state, continuation)


def _continuation_nll(model, state: PrefillState, continuation: Sequence[int]) -> torch.Tensor:
    import torch

    from stages.decoding.state import forward_step

    dev = state.last_logits.device
    target = torch.tensor(list(continuation), dtype=torch.long, device=dev)  # [C]
    logits = state.last_logits.float()  # [1, V]: predicts continuation[0]
    if len(continuation) > 1:
        t = len(continuation) - 1
        pos = state.next_pos[:, None] + torch.arange(t, device=dev)[None]  # [1, C-1]
        real = torch.ones((1, t), dtype=torch.bool, device=dev)
        more, _ = forward_step(model, state.cache, state.valid, target[None, :-1], pos, real)
        logits = torch.cat([logits, more[0]], dim=0)  # [C, V]
    return torch.nn.functional.cross_entropy(logits, target, reduction="none")


def _row(run: EvalRun | None, doc_id: str, **fields: Any) -> dict[str, Any]:
    base = {"task": "nll", "method": run.method if run else NO_CONTEXT,
            "target_tokens": run.target_tokens if run else None, "doc_id": doc_id}  # fmt: skip
    keys = ("nll", "doc_tokens", "context_tokens", "compression_ratio", "compress_s", "e2e_s", "error")
    return base | {k: fields.get(k) for k in keys}


def _score_docs(
    run: EvalRun | None, model, tokenizer, condition: Callable, docs: list[tuple[str, str]],
    continuation_tokens: int, query_tokens: int,
) -> list[dict[str, Any]]:  # fmt: skip
    start = start_ids(tokenizer)
    cap = getattr(model.config, "max_position_embeddings", None) or 10**9
    max_earlier = cap - continuation_tokens - len(start)
    out = []
    for doc_id, text in docs:
        try:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            earlier, cont = split_document(ids, continuation_tokens, max_earlier)
            t0 = time.perf_counter()
            cond = condition(start, earlier, query_tokens)
            nll = float(continuation_nll(model, cond.state, cont).mean())
            ctx = cond.context_tokens[0]
            out.append(_row(run, doc_id, nll=nll, doc_tokens=len(earlier), context_tokens=ctx,
                            compression_ratio=len(earlier) / ctx if ctx else None,
                            compress_s=cond.compress_s[0], e2e_s=time.perf_counter() - t0))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a bad document fails alone, as a row
            out.append(_row(run, doc_id, error=f"nll: {type(e).__name__}: {e}"))
    return out


def _no_context(model, tokenizer):
    """The reference conditioner: the start token only (context_tokens 0)."""
    from stages.decoding.state import CompressedPrefill, prefill_full

    def condition(start: list[int], earlier: list[int], query_tokens: int) -> CompressedPrefill:
        return CompressedPrefill(prefill_full(model, [start], tokenizer.pad_token_id), [0], [0.0])

    return condition


def run_nll(
    runs: Sequence[EvalRun], specs: dict[str, Any], docs: list[tuple[str, str]], *,
    continuation_tokens: int = DEFAULT_CONTINUATION, query_tokens: int = DEFAULT_QUERY_TOKENS,
    device: torch.device | None = None, failed: dict[str, str] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """Score every run (``specs[run.tag]`` is its JobSpec) and the no-context reference on
    ``docs``; see the module contract. A run that cannot load is recorded in ``failed``
    (tag -> error) and gives one error row per document. ``progress``: one line per
    run on stderr."""
    from stages.model_loading import load_causal_lm, pick_device

    if continuation_tokens < 1 or query_tokens < 1:
        raise ValueError(f"--continuation-tokens and query_tokens must be >= 1, got {continuation_tokens}, {query_tokens}")
    device = device or pick_device(1)
    failed = failed if failed is not None else {}
    rows: list[dict[str, Any]] = []
    if runs:
        job = specs[runs[0].tag]
        model, tok = load_causal_lm(job.generation.model, job.generation.dtype, device)
        rows += _score_docs(None, model, tok, _no_context(model, tok), docs, continuation_tokens, query_tokens)
        del model
    for run in runs:
        job = specs[run.tag]
        try:
            loaded, condition = condition_for(method_for(job.compression), job, device)
        except Exception as e:  # noqa: BLE001 - one broken method must not sink the others
            failed[f"nll:{run.tag}"] = f"{type(e).__name__}: {e}"
            rows += [_row(run, d, error=f"nll: {failed[f'nll:{run.tag}']}") for d, _ in docs]
            continue
        rows += _score_docs(run, loaded.model, loaded.tokenizer, condition, docs, continuation_tokens, query_tokens)
        if progress:
            done = [r["nll"] for r in rows[-len(docs) :] if r["error"] is None]
            print(f"nll: {run.tag}: {len(done)}/{len(docs)} documents scored", file=sys.stderr)
    return rows


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def aggregate_nll(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per (method, budget): no-context first, then registry order and budget."""
    order = (NO_CONTEXT, *registry())
    groups: dict[tuple[str, int | None], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["target_tokens"]), []).append(r)

    def key(k: tuple[str, int | None]) -> tuple[int, int]:
        return (order.index(k[0]) if k[0] in order else len(order), k[1] or -1)

    out = []
    for (method, budget), rs in sorted(groups.items(), key=lambda kv: key(kv[0])):
        ok = [r for r in rs if r["error"] is None]
        s: dict[str, Any] = {"task": "nll", "method": method, "target_tokens": budget,
                             "n": len(rs), "failed": len(rs) - len(ok)}  # fmt: skip
        for c in ("nll", "compression_ratio", "context_tokens", "compress_s", "e2e_s"):
            s[c] = aggregate_ratio(ok) if c == "compression_ratio" else _mean(
                [float(r[c]) for r in ok if r[c] is not None])
        out.append(s)
    ref = {s["method"]: s["nll"] for s in out if s["target_tokens"] is None}
    low, high = ref.get(NO_CONTEXT), ref.get("none")
    for s in out:
        gap = None if low is None or high is None or s["nll"] is None else low - high
        s["gap_recovered"] = (low - s["nll"]) / gap if gap else None
    return out
