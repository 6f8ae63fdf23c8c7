"""Finch early-exit layouts side by side, from ONE compression per question (CPU, one thread).

Each question's document is compressed once by Finch (the shipped heads, budget ``--target``);
the kept tokens and their last-pass scores (``FinchStep.kept_score``) are then laid out in
several ways, each prefilled with the pipeline's prompt and answered greedily (32 tokens):

- doc:      the selected tokens in document order (keep tokens, order document)
- rel:      the selected runs, least relevant first (keep tokens, order relevance)
- share:    whole sentences ranked by the share of their tokens selected, document order
- max:      whole sentences ranked by their best token's score, document order (keep sentences)
- max_rel:  the same sentences, least relevant first (keep sentences, order relevance: the
            qa default)
- share_rel: share-ranked sentences, least relevant first
- max_best_last: max's sentences in document order, except the single best one, moved last
- next_rel / next_doc: max's ranking, each sentence taken with the sentence after it (context)
- psg_rel / psg_doc: passages (consecutive sentences up to 128 tokens) ranked by their best
            kept token, whole passages within the budget
- max_rel_t3 / max_rel_t5: max_rel without the sentences scoring below 0.3 / 0.5 x the best
            (``min_relevance``; 0.5 is the qa default)
- psg_rel_t5: psg_rel with the 0.5 floor per passage
- t5_next_rel: max_rel_t5's sentences, each with the sentence after it (may exceed a tiny
            budget; an experiment on context for native questions)
- rag:      the rag method's context at the same budget (the embedded MiniLM), for reference
- none:     the whole document (full context), for reference

A row is correct when the normalised reference occurs in the answer (``contains``, as in
``longdoc eval``); ``*_ev`` says whether it occurs in the kept text itself (evidence recall).
Question sets: ``eval`` = jobs/eval/qa-tuning.jsonl (40), ``sample`` = jobs/sample-qa.jsonl (24
native questions on 8 other documents: a held-out check), ``needles`` = the eval's 24 needle
facts inserted at depths 0.2/0.5/0.8 into the 8 sample documents (held-out haystacks).

    OMP_NUM_THREADS=1 .venv/bin/python -m pipeline.studies.finch_layouts --set eval \
        --target 512 --variants doc,max,max_rel,rag --out /tmp/layout-eval-512.json

Results: jobs/eval/results/2026-11-23-finch-sentences-relevance-cpu.md and
2026-11-24-finch-relevance-floor-cpu.md; when each default was chosen:
jobs/results/code-choices.md, "pipeline/studies/finch_layouts.py".
"""

from __future__ import annotations

import argparse
import json

import torch

from pipeline.corpus.eval_records import insert_facts
from pipeline.corpus.qa import NEEDLES
from pipeline.eval.metrics import contains
from schemas.spec import DEFAULT_QA_INSTRUCTION, EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.compression.rag import load_embedder, rag_contexts
from stages.decoding.config import DecodeConfig, eos_ids_of
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.finch import finch_prefill
from stages.finch.config import SelectCompression
from stages.finch.order import kept_units, lay_out, order_by_relevance
from stages.finch.spans import sentence_boundaries, sentence_spans, snap_to_sentences
from stages.model_loading import load_causal_lm
from stages.prompting import PromptBuilder

VARIANTS = ("doc", "rel", "share", "max", "share_rel", "max_rel", "max_best_last", "rag", "none",
            "next_rel", "next_doc", "psg_rel", "psg_doc", "max_rel_t3", "max_rel_t5", "psg_rel_t5",
            "t5_next_rel")
PASSAGE_TOKENS = 128


EVAL_SET = "jobs/eval/qa-tuning.jsonl"
SAMPLE_SET = "jobs/sample-qa.jsonl"


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def question_set(name: str, eval_set: str = EVAL_SET, sample_set: str = SAMPLE_SET) -> list[dict]:
    """Rows with id, text, questions, answers and kinds."""
    if name == "eval":
        return [{**r, "kinds": r["kind"]} for r in read_jsonl(eval_set)]
    sample = read_jsonl(sample_set)
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
    return {"score": score, "doc": idx, "rel": order_by_relevance(kept_units(idx), score), "share": share, "max": best,
            "share_rel": order_by_relevance(kept_units(share, spans), score),
            "max_rel": order_by_relevance(kept_units(best, spans), score),
            "max_best_last": best_last(kept_units(best, spans), score),
            "next_rel": order_by_relevance(kept_units(with_next(best, spans, score, k)), score),
            "next_doc": with_next(best, spans, score, k),
            "psg_rel": order_by_relevance(kept_units(passages(spans, score, k)), score),
            "psg_doc": passages(spans, score, k),
            "max_rel_t3": lay_out(best, spans, score, "relevance", 0.3),
            "max_rel_t5": lay_out(best, spans, score, "relevance", 0.5),
            "t5_next_rel": order_by_relevance(kept_units(following(lay_out(best, spans, score, "document", 0.5), spans)), score),
            "psg_rel_t5": order_by_relevance(kept_units(lay_out(passages(spans, score, k), group(spans), score, "document", 0.5)), score)}


def unit_best(start: int, end: int, score: dict[int, float]) -> float:
    return max((score[j] for j in range(start, end) if j in score), default=float("-inf"))


def with_next(best: list[int], spans, score: dict[int, float], k: int) -> list[int]:
    """max's sentences, each followed by its next sentence (context), best first, within k."""
    ranked = sorted(range(len(spans)), key=lambda i: -unit_best(*spans[i], score))
    chosen: set[int] = set()
    for i in ranked:
        if unit_best(*spans[i], score) == float("-inf"):
            break
        for m in (i, i + 1):
            if m < len(spans) and not chosen.issuperset(range(*spans[m])):
                if len(chosen | set(range(*spans[m]))) <= k:
                    chosen.update(range(*spans[m]))
    return sorted(chosen)


def following(chosen: list[int], spans) -> list[int]:
    """``chosen`` plus the whole sentence after each of its sentences."""
    out, have = set(chosen), set(chosen)
    for i, (s, e) in enumerate(spans[:-1]):
        if any(j in have for j in range(s, e)):
            out.update(range(*spans[i + 1]))
    return sorted(out)


def group(spans, size: int = PASSAGE_TOKENS) -> list[tuple[int, int]]:
    """Consecutive sentences grouped into passages of at most ``size`` tokens."""
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if out and end - out[-1][0] <= size:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def passages(spans, score: dict[int, float], k: int) -> list[int]:
    """Passages ranked by their best kept token, whole passages while they fit k."""
    ps = group(spans)
    chosen: set[int] = set()
    for start, end in sorted(ps, key=lambda p: -unit_best(*p, score)):
        if unit_best(start, end, score) == float("-inf"):
            break
        if len(chosen) + end - start <= k:
            chosen.update(range(start, end))
    return sorted(chosen)


def best_last(units: list[list[int]], score: dict[int, float]) -> list[int]:
    """Document order, but the unit holding the best-scored token goes last."""
    top = max(range(len(units)), key=lambda i: max(score.get(j, float("-inf")) for j in units[i]))
    return [j for i, u in enumerate(units) if i != top for j in u] + units[top]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="eval", help="eval, sample or needles (see the module docstring)")
    ap.add_argument("--target", type=int, default=512)
    ap.add_argument("--variants", default="doc,max,max_rel,rag")
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=0, help="stop after this many questions (0 = all)")
    ap.add_argument("--model", default=EMBEDDED_MODEL)
    ap.add_argument("--embedder", default=EMBEDDED_EMBEDDER, help="rag's embedder")
    ap.add_argument("--eval-set", default=EVAL_SET)
    ap.add_argument("--sample-set", default=SAMPLE_SET, help="the documents of --set sample and needles")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    if bad := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"unknown variants {bad}; allowed: {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    model, tok = load_causal_lm(args.model)
    builder, bounds = PromptBuilder(tok), sentence_boundaries(tok)
    embedder = load_embedder(args.embedder) if "rag" in names else None
    dcfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_ids=eos_ids_of(tok, model.generation_config))
    cfg = SelectCompression(target_tokens=args.target, keep="tokens", order="document")
    results = []
    for row in question_set(args.set, args.eval_set, args.sample_set):
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
            rec = {"doc": row["id"], "kind": kind, "question": q, "reference": a,
                   "sentence_best": sorted((unit_best(s0, e0, keeps["score"]) for s0, e0 in spans
                                            if unit_best(s0, e0, keeps["score"]) > float("-inf")), reverse=True)}
            for name in names:
                if name == "none":
                    toks = doc
                elif name == "rag":
                    ctx = rag_contexts([doc], [q], tokenizer=tok, embedder=embedder, target_tokens=args.target)[0]
                    toks = ctx.context_ids
                else:
                    toks = [doc[j] for j in keeps[name]]
                with torch.no_grad():
                    state = prefill_full(model, [parts.prefix_ids + toks + parts.query_ids], tok.pad_token_id)
                    answer = tok.decode(decode_plain(model, state, dcfg)[0].tokens, skip_special_tokens=True)
                rec |= {name: contains(answer, a), f"{name}_ev": contains(tok.decode(toks), a), f"{name}_answer": answer, f"{name}_n": len(toks)}
            results.append(rec)
            print(kind[:3], [int(rec[n]) for n in names], q[:50], flush=True)
            if args.limit and len(results) >= args.limit:
                break
        if args.limit and len(results) >= args.limit:
            break
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"| kind | n | {' | '.join(f'{n} (evidence)' for n in names)} |")
    for kind in ("inserted", "native", None):
        rows = [r for r in results if kind is None or r["kind"] == kind]
        if rows:
            cells = " | ".join(f"{sum(r[n] for r in rows):.0f} ({sum(r[n + '_ev'] for r in rows):.0f})" for n in names)
            print(f"| {kind or 'all'} | {len(rows)} | {cells} |")
    return results


if __name__ == "__main__":
    main()
