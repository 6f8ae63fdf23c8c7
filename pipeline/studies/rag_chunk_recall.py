"""Answer recall of rag's kept context by chunk size, on the eval set.

For each of the eval set's questions: does the reference answer survive in the context
rag keeps (pipeline.eval.metrics.contains on the decoded context: normalised substring)?
Rows: auto chunk sizes (``chunk_tokens`` null at several window fractions) and fixed
``chunk_tokens``; columns: budgets. Also the mean chunk size and chunks the embedder cut.

    OMP_NUM_THREADS=2 .venv/bin/python -m pipeline.studies.rag_chunk_recall [--eval-set jobs/eval/qa-tuning.jsonl]

Results: jobs/results/rag_chunk_recall.md (chose ``chunk_tokens: auto``, 0.5 of the window).
"""

from __future__ import annotations

import argparse
import json

import torch

from pipeline.eval.metrics import contains
from schemas.spec import EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.compression.chunks import RetrievalResult
from stages.compression.rag import chunk_document, load_embedder, rag_contexts
from stages.model_loading import load_tokenizer

BUDGETS = (256, 512, 1024)
AUTO = (1.0, 0.75, 0.5, 0.375, 0.25)
FIXED = (64, 96, 128, 160, 192, 256)


class CachedEmbedder:
    """The real embedder, each distinct text embedded once across the sweep."""

    def __init__(self, inner) -> None:
        self.inner, self.max_tokens, self.cache = inner, inner.max_tokens, {}

    def count_tokens(self, texts):
        return self.inner.count_tokens(texts)

    def _get(self, kind, texts, fn):
        new = [t for t in dict.fromkeys(texts) if (kind, t) not in self.cache]
        if new:
            for t, e in zip(new, fn(new)):
                self.cache[(kind, t)] = e
        return torch.stack([self.cache[(kind, t)] for t in texts])

    def embed_queries(self, texts):
        return self._get("q", texts, self.inner.embed_queries)

    def embed_chunks(self, texts):
        return self._get("c", texts, self.inner.embed_chunks)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval-set", default="jobs/eval/qa-tuning.jsonl")
    ap.add_argument("--model", default=EMBEDDED_MODEL, help="whose tokens the budgets count")
    ap.add_argument("--embedder", default=EMBEDDED_EMBEDDER)
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--auto", default=",".join(f"{f:g}" for f in AUTO), help="window fractions (chunk_tokens auto)")
    ap.add_argument("--fixed", default=",".join(map(str, FIXED)), help="fixed chunk_tokens")
    args = ap.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    tok = load_tokenizer(args.model)
    emb = CachedEmbedder(load_embedder(args.embedder, "cpu"))
    with open(args.eval_set, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    configs = [(f"auto {float(f):g} of window", None, float(f)) for f in args.auto.split(",") if f] + [
        (f"fixed {int(c)}", int(c), 1.0) for c in args.fixed.split(",") if c
    ]
    print("| chunk_tokens | mean chunk | cut by embedder | " + " | ".join(f"recall@{b}" for b in budgets) + " |")
    print("|---|---|---|" + "---|" * len(budgets))
    table = []
    for name, chunk, frac in configs:
        hits = {b: 0 for b in budgets}
        n_q = n_chunks = n_cut = n_tok = 0
        for d in docs:
            ids = tok(d["text"], add_special_tokens=False)["input_ids"]
            chunks, _, cut = chunk_document(
                ids, chunk, decode=lambda c: tok.batch_decode(c, skip_special_tokens=True),
                count=emb.count_tokens, max_tokens=emb.max_tokens, window_fraction=frac,
            )
            n_chunks, n_cut, n_tok = n_chunks + len(chunks), n_cut + cut, n_tok + len(ids)
            n_q += len(d["questions"])
            for b in budgets:
                res = rag_contexts([ids] * len(d["questions"]), d["questions"], tokenizer=tok, embedder=emb,
                                   target_tokens=b, chunk_tokens=chunk, window_fraction=frac)
                for r, ans in zip(res, d["answers"]):
                    assert isinstance(r, RetrievalResult), r
                    hits[b] += contains(tok.decode(r.context_ids, skip_special_tokens=True), ans) > 0
        row = {"chunk_tokens": name, "mean_chunk": n_tok / n_chunks, "cut": n_cut, "chunks": n_chunks,
               "recall": {b: hits[b] / n_q for b in budgets}}
        table.append(row)
        print(f"| {name} | {row['mean_chunk']:.0f} | {n_cut}/{n_chunks} | "
              + " | ".join(f"{row['recall'][b]:.3f}" for b in budgets) + " |", flush=True)
    return table


if __name__ == "__main__":
    main()
