"""Finch early-exit layouts side by side, from ONE compression per question (CPU, one thread).

Each question's document is compressed once by Finch (the shipped heads, budget ``--target``);
the kept tokens and their last-pass scores (``FinchStep.kept_score``) are then laid out in
several ways, each prefilled with the pipeline's prompt and answered greedily (32 tokens):

- doc:      the selected tokens in document order (keep tokens, order document)
- rel:      the selected runs, least relevant first (keep tokens, order relevance)
- share:    whole sentences ranked by the share of their tokens selected, document order
- max:      whole sentences ranked by their best token's score, document order (keep sentences)
- max_rel:  the same sentences, least relevant first (keep sentences, order relevance: the
            qa default since 2026-11-23)
- share_rel: share-ranked sentences, least relevant first
- max_best_last: max's sentences in document order, except the single best one, moved last
- rag:      the rag method's context at the same budget (the embedded MiniLM), for reference

A row is correct when the normalised reference occurs in the answer (``contains``, as in
``longdoc eval``); ``*_ev`` says whether it occurs in the kept text itself (evidence recall).
Question sets: ``eval`` = jobs/eval/qa-eval.jsonl (40), ``sample`` = jobs/sample-qa.jsonl (24
native questions on 8 other documents: a held-out check), ``needles`` = the eval's 24 needle
facts inserted at depths 0.2/0.5/0.8 into the 8 sample documents (held-out haystacks).

    OMP_NUM_THREADS=1 .venv/bin/python jobs/results/finch_layout_eval.py --set eval \
        --target 512 --variants doc,max,max_rel,rag --out /tmp/layout-eval-512.json
"""

from __future__ import annotations

import argparse
import json

import torch

from pipeline.corpus.eval_records import insert_facts
from pipeline.corpus.qa import NEEDLES
from pipeline.eval.metrics import contains
from schemas.spec import DEFAULT_QA_INSTRUCTION, EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.compression.finch import FinchCompression
from stages.compression.rag import load_embedder, rag_contexts
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.finch import finch_prefill
from stages.finch.order import kept_units, order_by_relevance
from stages.finch.spans import sentence_boundaries, sentence_spans, snap_to_sentences
from stages.model_loading import load_causal_lm
from stages.prompting import PromptBuilder

VARIANTS = ("doc", "rel", "share", "max", "share_rel", "max_rel", "max_best_last", "rag")


def question_set(name: str) -> list[dict]:
    """Rows with id, text, questions, answers and kinds."""
    if name == "eval":
        rows = [json.loads(line) for line in open("jobs/eval/qa-eval.jsonl", encoding="utf-8")]
        return [{**r, "kinds": r["kind"]} for r in rows]
    sample = [json.loads(line) for line in open("jobs/sample-qa.jsonl", encoding="utf-8")]
    if name == "sample":
        return [{**r, "kinds": ["native"] * len(r["questions"])} for r in sample]
    if name == "needles":
        out = []
        for d, doc in enumerate(sample):
            facts = NEEDLES[3 * d : 3 * d + 3]
            text, _ = insert_facts(doc["text"], [(s, depth) for (s, _, _), depth in zip(facts, (0.2, 0.5, 0.8))])
            out.append({"id": doc["id"], "text": text, "questions": [q for _, q, _ in facts],
                        "answers": [a for _, _, a in facts], "kinds": ["inserted"] * 3})
        return out
    raise SystemExit(f"unknown --set {name!r}; allowed: eval, sample, needles")


def layouts(idx: list[int], score: dict[int, float], spans, k: int) -> dict[str, list[int]]:
    share, best = snap_to_sentences(idx, spans, k), snap_to_sentences(idx, spans, k, score)
    return {"doc": idx, "rel": order_by_relevance(kept_units(idx), score), "share": share, "max": best,
            "share_rel": order_by_relevance(kept_units(share, spans), score),
            "max_rel": order_by_relevance(kept_units(best, spans), score),
            "max_best_last": best_last(kept_units(best, spans), score)}


def best_last(units: list[list[int]], score: dict[int, float]) -> list[int]:
    """Document order, but the unit holding the best-scored token goes last."""
    top = max(range(len(units)), key=lambda i: max(score.get(j, float("-inf")) for j in units[i]))
    return [j for i, u in enumerate(units) if i != top for j in u] + units[top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="eval")
    ap.add_argument("--target", type=int, default=512)
    ap.add_argument("--variants", default="doc,max,max_rel,rag")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    names = args.variants.split(",")
    if bad := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"unknown variants {bad}; allowed: {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    model, tok = load_causal_lm(EMBEDDED_MODEL)
    builder, bounds = PromptBuilder(tok), sentence_boundaries(tok)
    embedder = load_embedder(EMBEDDED_EMBEDDER) if "rag" in names else None
    eos = {tok.eos_token_id}
    gen = model.generation_config.eos_token_id
    eos |= set(gen) if isinstance(gen, (list, tuple)) else {gen}
    dcfg = DecodeConfig(max_new_tokens=32, eos_ids=frozenset(e for e in eos if e is not None))
    cfg = FinchCompression(target_tokens=args.target, keep="tokens", order="document")
    results = []
    for row in question_set(args.set):
        doc = builder.encode_text(row["text"])
        spans = sentence_spans(doc, bounds)
        for q, a, kind in zip(row["questions"], row["answers"], row["kinds"], strict=True):
            parts = builder.build(doc, DEFAULT_QA_INSTRUCTION, q)
            trace: list = []
            with torch.no_grad():
                finch_prefill(model, [parts], cfg, tok.pad_token_id, trace=trace)
            last, k = trace[-1], trace[-1].kept[0]
            idx = last.kept_index[0][0, 0, -k:].tolist()
            keeps = layouts(idx, dict(zip(idx, last.kept_score[0, -k:].tolist(), strict=True)), spans, k)
            rec = {"doc": row["id"], "kind": kind, "question": q, "reference": a}
            for name in names:
                if name == "rag":
                    ctx = rag_contexts([doc], [q], tokenizer=tok, embedder=embedder, target_tokens=args.target)[0]
                    toks = ctx.context_ids
                else:
                    toks = [doc[j] for j in keeps[name]]
                with torch.no_grad():
                    state = prefill_full(model, [parts.prefix_ids + toks + parts.query_ids], tok.pad_token_id)
                    answer = tok.decode(decode_plain(model, state, dcfg)[0].tokens, skip_special_tokens=True)
                rec |= {name: contains(answer, a), f"{name}_ev": contains(tok.decode(toks), a), f"{name}_answer": answer}
            results.append(rec)
            print(kind[:3], [int(rec[n]) for n in names], q[:50], flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"| kind | n | {' | '.join(f'{n} (evidence)' for n in names)} |")
    for kind in ("inserted", "native", None):
        rows = [r for r in results if kind is None or r["kind"] == kind]
        if rows:
            cells = " | ".join(f"{sum(r[n] for r in rows):.0f} ({sum(r[n + '_ev'] for r in rows):.0f})" for n in names)
            print(f"| {kind or 'all'} | {len(rows)} | {cells} |")


if __name__ == "__main__":
    main()
