"""Answer recall of rag's kept context by chunk size, on the eval set (issue 13 item 2).

For each of the eval set's questions: does the reference answer survive in the context
rag keeps (pipeline.eval.metrics.contains on the decoded context: normalised substring)?
Rows: auto chunk sizes (``chunk_tokens`` null at several window fractions) and fixed
``chunk_tokens``; columns: budgets. Also the mean chunk size and chunks the embedder cut.

    OMP_NUM_THREADS=2 .venv/bin/python jobs/results/rag_chunk_recall.py [jobs/eval/qa-eval.jsonl]
"""

from __future__ import annotations

import json
import sys

import torch

from pipeline.eval.metrics import contains
from schemas.spec import EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.compression.rag import RagResult, chunk_document, load_embedder, rag_contexts
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


def main(path: str = "jobs/eval/qa-eval.jsonl") -> None:
    tok = load_tokenizer(EMBEDDED_MODEL)
    emb = CachedEmbedder(load_embedder(EMBEDDED_EMBEDDER, "cpu"))
    docs = [json.loads(line) for line in open(path)]
    configs = [(f"auto {f:g} of window", None, f) for f in AUTO] + [(f"fixed {c}", c, 1.0) for c in FIXED]
    print("| chunk_tokens | mean chunk | cut by embedder | " + " | ".join(f"recall@{b}" for b in BUDGETS) + " |")
    print("|---|---|---|" + "---|" * len(BUDGETS))
    for name, chunk, frac in configs:
        hits = {b: 0 for b in BUDGETS}
        n_q = n_chunks = n_cut = n_tok = 0
        for d in docs:
            ids = tok(d["text"], add_special_tokens=False)["input_ids"]
            chunks, _, cut = chunk_document(
                ids, chunk, decode=lambda c: tok.batch_decode(c, skip_special_tokens=True),
                count=emb.count_tokens, max_tokens=emb.max_tokens, window_fraction=frac,
            )
            n_chunks, n_cut, n_tok = n_chunks + len(chunks), n_cut + cut, n_tok + len(ids)
            n_q += len(d["questions"])
            for b in BUDGETS:
                res = rag_contexts([ids] * len(d["questions"]), d["questions"], tokenizer=tok, embedder=emb,
                                   target_tokens=b, chunk_tokens=chunk, window_fraction=frac)
                for r, ans in zip(res, d["answers"]):
                    assert isinstance(r, RagResult), r
                    hits[b] += contains(tok.decode(r.context_ids, skip_special_tokens=True), ans) > 0
        print(f"| {name} | {n_tok / n_chunks:.0f} | {n_cut}/{n_chunks} | "
              + " | ".join(f"{hits[b] / n_q:.3f}" for b in BUDGETS) + " |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
