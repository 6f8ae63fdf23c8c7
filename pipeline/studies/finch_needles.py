"""Needle QA at one budget: Finch scorings and modes vs RAG vs truncation (focused, one process).

The inserted-fact questions of jobs/eval/qa-tuning.jsonl (kind == inserted), ordered by
question index then document (so the first 8 cover all 8 documents), the first
``--limit`` of them. Each method compresses the document to ``--target`` tokens, the
embedded model answers greedily (``--max-new-tokens``), and a row is correct when the
normalised reference occurs in the answer (pipeline.eval.metrics ``contains``, as in
``longdoc eval``). Prompts are the pipeline's (PromptBuilder, the default QA
instruction). Time per row: compression + prefill seconds (CPU seconds of this
process, one thread), decoding excluded.

    OMP_NUM_THREADS=1 .venv/bin/python -m pipeline.studies.finch_needles \
        --methods finch-heads-ee,finch-heads-kv --limit 12 --out /tmp/needle.json

Methods: finch-paper (scoring paper, mode kv), finch-heads-kv, finch-heads-ee
(scoring heads, mode kv / early_exit), finch-heads-ee-l16 / -l8 (early exit with
max_scoring_layers 16 / 8), rag (chunk 256, the embedded MiniLM), truncate (head_tail).
Results: jobs/results/2026-11-23-finch-heads-cpu.md, jobs/results/2026-11-26-finch-depth-cpu.md.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from pipeline.eval.metrics import score
from schemas.spec import DEFAULT_QA_INSTRUCTION, EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.compression.finch import prompt_similarity
from stages.compression.rag import load_embedder, rag_contexts
from stages.compression.truncate import truncate_ids
from stages.decoding.config import DecodeConfig, eos_ids_of
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.finch import finch_prefill
from stages.finch.config import FinchCompression, SelectCompression
from stages.finch.spans import sentence_boundaries
from stages.model_loading import load_causal_lm
from stages.prompting import PromptBuilder

FINCH = {
    "finch-paper": {"scoring": "paper", "mode": "kv"},
    "finch-heads-kv": {"scoring": "heads", "mode": "kv"},
    "finch-heads-ee": {"scoring": "heads", "mode": "early_exit"},
    # The same with only the first 16 / 8 layers' heads selecting (max_scoring_layers): the
    # embedded model's calibrated heads sit in layers 18-22, so every head of those layers.
    "finch-heads-ee-l16": {"scoring": "heads", "mode": "early_exit", "max_scoring_layers": 16},
    "finch-heads-ee-l8": {"scoring": "heads", "mode": "early_exit", "max_scoring_layers": 8},
}


def questions(path: str, limit: int) -> list[dict]:
    """The inserted-fact questions of an eval set (JSONL), by question index then document."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = []
    for qi in range(max(len(r["questions"]) for r in rows)):
        for r in rows:
            if qi < len(r["questions"]) and r["kind"][qi] == "inserted":
                out.append({"doc": r["id"], "text": r["text"], "q": r["questions"][qi],
                            "a": r["answers"][qi], "depth": r["depths"][qi]})
    return out[:limit]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="finch-paper,finch-heads-kv,finch-heads-ee,rag,truncate")
    ap.add_argument("--eval-set", default="jobs/eval/qa-tuning.jsonl")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--target", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--model", default=EMBEDDED_MODEL)
    ap.add_argument("--embedder", default=EMBEDDED_EMBEDDER, help="rag's embedder")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    if bad := [m for m in methods if m not in (*FINCH, "rag", "truncate")]:
        raise SystemExit(f"unknown methods {bad}; allowed: {', '.join((*FINCH, 'rag', 'truncate'))}")
    torch.set_num_threads(1)
    model, tok = load_causal_lm(args.model)
    builder = PromptBuilder(tok)
    pad = tok.pad_token_id
    bounds = sentence_boundaries(tok)
    dcfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=eos_ids_of(tok, model.generation_config))
    embedder = None
    similarities: dict[str, object] = {}
    results = []
    for method in methods:
        for q in questions(args.eval_set, args.limit):
            doc = builder.encode_text(q["text"])
            c0 = time.process_time()
            if method in FINCH:
                model_cls = FinchCompression if FINCH[method].get("mode") == "kv" else SelectCompression
                cfg = model_cls(target_tokens=args.target, chunk_tokens=args.chunk,
                                **FINCH[method]).resolved("qa")
                if cfg.evidence not in similarities:  # fused evidence: the embedder, loaded once
                    similarities[cfg.evidence] = prompt_similarity(cfg, tok, model.device)
                state = finch_prefill(model, [builder.build(doc, DEFAULT_QA_INSTRUCTION, q["q"])], cfg, pad,
                                      boundaries=bounds, similarity=similarities[cfg.evidence]).state
            else:
                if method == "rag":
                    embedder = embedder or load_embedder(args.embedder)
                    res = rag_contexts([doc], [q["q"]], tokenizer=tok, embedder=embedder,
                                       target_tokens=args.target, chunk_tokens=256)[0]
                    assert not isinstance(res, BaseException), res
                    ctx = res.context_ids
                else:
                    ctx = truncate_ids(doc, args.target, "head_tail")
                state = prefill_full(model, [builder.build(ctx, DEFAULT_QA_INSTRUCTION, q["q"]).full_ids], pad)
            cpu_s = time.process_time() - c0
            answer = tok.decode(decode_plain(model, state, dcfg)[0].tokens, skip_special_tokens=True)
            ok = score(answer, q["a"])["contains"]
            results.append({"method": method, "doc": q["doc"], "depth": q["depth"], "question": q["q"],
                            "reference": q["a"], "answer": answer, "contains": ok, "cpu_s": round(cpu_s, 2)})
            print(f"{method:15s} {q['doc']:22s} d={q['depth']:.2f} ok={ok:.0f} {cpu_s:6.1f}s  {answer[:60]!r}", flush=True)
    print(f"| method | contains@{args.target} | rows | CPU s per row (compress + prefill) |")
    print("|---|---:|---:|---:|")
    for method in methods:
        rows = [r for r in results if r["method"] == method]
        print(f"| {method} | {sum(r['contains'] for r in rows) / len(rows):.2f} | {len(rows)} | "
              f"{sum(r['cpu_s'] for r in rows) / len(rows):.1f} |")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
