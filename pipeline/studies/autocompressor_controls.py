"""How much of a kv-form AutoCompressor's NLL gain comes from the document itself?

`longdoc eval --metrics nll` scores the autocompressor row with the adapter-merged model
and the reference rows (no context, full context) with the base model, so its
gap_recovered mixes two things: what the kept slots carry of the document and what the
adapter (trained on another corpus) and any document-shaped context give. This script
scores, with the product's own pieces (pipeline/eval/nll.py's split and scoring,
stages/autocompressor/prefill.py's conditioning), per eval document:
- no_context / full / trunc: the base model on [start], [start ; earlier],
  [start ; the last K earlier tokens] (K = the row's kept slots);
- ac: the checkpoint conditioned on the document's own earlier text (= the eval's row);
- ac_other: the same continuation, conditioned on the NEXT document's earlier text;
- ac_none: the checkpoint with no document (the adapter alone).
page-specific share = (ac_other - ac) / (no_context - full).

    .venv/bin/python -m pipeline.studies.autocompressor_controls --checkpoint DIR --out F.json

Results: jobs/results/autocompressor/kv_eval_control.json (README.md there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from pipeline.eval.nll import continuation_nll, read_eval_documents, split_document, start_ids
from stages.autocompressor.config import AutoCompressorCompression
from stages.autocompressor.prefill import autocompressor_prefill, load_autocompressor
from stages.decoding.state import prefill_full
from stages.model_loading import load_causal_lm
from stages.prompting import PromptParts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--eval-set", default="jobs/eval/qa-tuning.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--continuation", type=int, default=128)
    ap.add_argument("--segment-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    lm, tok, ac = load_autocompressor(a.checkpoint, "float32", torch.device("cpu"))
    base, _ = load_causal_lm(json.loads((Path(a.checkpoint) / "autocompressor.json").read_text())["base_model"],
                             "float32", torch.device("cpu"))
    cfg = AutoCompressorCompression(checkpoint=a.checkpoint, segment_tokens=a.segment_tokens)
    start, pad = start_ids(tok), tok.pad_token_id
    docs = read_eval_documents(a.eval_set, a.limit)
    splits = []
    for doc_id, text in docs:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cap = lm.config.max_position_embeddings - a.continuation - len(start)
        splits.append((doc_id, *split_document(ids, a.continuation, cap)))

    def base_nll(context: list[int], cont: list[int]) -> float:
        return float(continuation_nll(base, prefill_full(base, [start + context], pad), cont).mean())

    def ac_nll(earlier: list[int], cont: list[int]) -> tuple[float, int]:
        res = autocompressor_prefill(ac, [PromptParts(start, earlier, [])], cfg, pad)
        return float(continuation_nll(lm, res.state, cont).mean()), res.context_tokens[0]

    rows = []
    for i, (doc_id, earlier, cont) in enumerate(splits):
        own, kept = ac_nll(earlier, cont)
        row = {"id": doc_id, "earlier": len(earlier), "kept": kept, "no_context": base_nll([], cont),
               "full": base_nll(earlier, cont), "trunc": base_nll(earlier[-kept:], cont), "ac": own,
               "ac_other": ac_nll(splits[(i + 1) % len(splits)][1], cont)[0], "ac_none": ac_nll([], cont)[0]}
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    keys = ("no_context", "full", "trunc", "ac", "ac_other", "ac_none")
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    gap = mean["no_context"] - mean["full"]
    shares = {"gap_recovered": (mean["no_context"] - mean["ac"]) / gap,
              "page_specific": (mean["ac_other"] - mean["ac"]) / gap,
              "trunc_recovered": (mean["no_context"] - mean["trunc"]) / gap,
              "compression": sum(r["earlier"] for r in rows) / sum(r["kept"] for r in rows)}
    print(json.dumps({"mean": {k: round(v, 4) for k, v in mean.items()}, **{k: round(v, 3) for k, v in shares.items()}}))
    result = {"checkpoint": a.checkpoint, "eval_set": a.eval_set, "mean": mean, **shares, "rows": rows}
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
