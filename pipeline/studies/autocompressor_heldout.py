"""Continuation NLL with and without the AutoCompressor's summaries, on held-out pages.

For each held-out document (pipeline/corpus/autocompressor_corpus.py's ``heldout.jsonl``, in no eval set and not
trained on): ``earlier`` = its first E tokens, ``cont`` = the next C tokens; every condition
scores cont[1:] (mean nats per token) so all share the same targets:
- none:  cont alone (the base model; no context)
- full:  earlier + cont (the base model; full context)
- trunc: the last K*E/S tokens of earlier + cont (the base model; same budget as the summaries)
- ac_none: cont alone, scored by the trained checkpoint (LoRA merged; does LoRA alone help?)
- ac:    earlier compressed segment by segment (S tokens each) into K summary vectors per
         segment, then cont conditioned on them (the trained checkpoint, LoRA merged)
- ac_other: the same, but the summaries of the NEXT held-out document's earlier text: equal
         to ac when the summaries carry nothing of their own document
Recovered gap = (none - ac) / (none - full). Compression = E / (K * E/S) = S / K.
A checkpoint of summary form ``kv`` (kv_form.py) keeps every k-th token's keys/values
instead of K summary vectors (compression ~k); its ac / ac_other / ac_none rows are the
same conditions, and it has no reconstruction rows.
by_summaries = (ac_none - ac) / (none - full): the part of that gap the summaries recover
beyond what the adapter alone does (the honest share; 0 when summaries carry nothing).
Reconstruction (what a summary holds of its own segment; the first segment of earlier):
- rec:       its tokens scored after [its own summary ; marker] (reconstruction_loss)
- rec_other: the same tokens after the NEXT document's first-segment summary

    .venv/bin/python -m pipeline.studies.autocompressor_heldout --checkpoint DIR

Results: jobs/results/autocompressor/nll_heldout*.json (README.md there names each command).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from stages.autocompressor.checkpoint import load_own
from stages.autocompressor.model import ACConfig, AutoCompressor
from stages.model_loading import load_causal_lm


def nll(
    ac: AutoCompressor, ids: list[int], lengths: list[int], from_: int, summaries: bool
) -> float:
    x = torch.tensor([ids])
    with torch.no_grad():
        return ac(x, lengths, use_summaries=summaries, loss_from=from_).loss.item()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--docs", type=Path, default=Path("out/ac-corpus/heldout.jsonl"))
    ap.add_argument("--earlier", type=int, default=1024)
    ap.add_argument("--cont", type=int, default=256)
    ap.add_argument("--segment", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--dtype", default="float32", help="float32 or bfloat16: weights and activations of both models"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ac, tok = load_own(args.checkpoint, args.dtype)
    base_lm, _ = load_causal_lm(
        json.loads((Path(args.checkpoint) / "autocompressor.json").read_text())["base_model"],
        args.dtype,
        torch.device("cpu"),
    )
    base = AutoCompressor(base_lm.eval(), ACConfig(summary_length=ac.config.summary_length))
    k, e, c, s = ac.config.summary_length, args.earlier, args.cont, args.segment
    if e % s:
        raise ValueError(f"--earlier {e} must be a multiple of --segment {s}")
    kv = ac.config.summary_form == "kv"
    if kv:
        from stages.autocompressor.kv_form import kept_offsets

        budget = (e // s) * len(kept_offsets(s, ac.config.kv_stride))
    else:
        budget = k * e // s
    rows, docs = [], []
    for line in args.docs.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        ids = tok(doc["text"], add_special_tokens=False).input_ids
        if len(ids) >= e + c:
            docs.append((doc["id"], ids))
    for i, (doc_id, ids) in enumerate(docs):
        earlier, cont = ids[:e], ids[e : e + c]
        other = docs[(i + 1) % len(docs)][1][:e]
        row = {
            "id": doc_id,
            "none": nll(base, cont, [c], 1, False),
            "full": nll(base, earlier + cont, [e + c], e + 1, False),
            "trunc": nll(base, earlier[-budget:] + cont, [budget + c], budget + 1, False),
            "ac_none": nll(ac, cont, [c], 1, False),  # the trained model, no context
            "ac": nll(ac, earlier + cont, [s] * (e // s) + [c], e + 1, True),
            "ac_other": nll(ac, other + cont, [s] * (e // s) + [c], e + 1, True),
        }
        if not kv:
            with torch.no_grad():
                own, theirs = ac.compress([[earlier[:s]], [other[:s]]])
                seg = torch.tensor([earlier[:s]])
                row["rec"] = ac.reconstruction_loss(own[None], seg).loss.item()
                row["rec_other"] = ac.reconstruction_loss(theirs[None], seg).loss.item()
        row["recovered"] = (row["none"] - row["ac"]) / (row["none"] - row["full"])
        rows.append(row)
        print(json.dumps({k2: round(v, 4) if isinstance(v, float) else v for k2, v in row.items()}))
    conditions = ("none", "full", "trunc", "ac_none", "ac", "ac_other") + (() if kv else ("rec", "rec_other"))
    mean = {m: sum(r[m] for r in rows) / len(rows) for m in conditions}
    mean["recovered"] = (mean["none"] - mean["ac"]) / (mean["none"] - mean["full"])
    mean["by_summaries"] = (mean["ac_none"] - mean["ac"]) / (mean["none"] - mean["full"])
    summary = {
        "docs": len(rows),
        "earlier": e,
        "cont": c,
        "segment": s,
        "summary_vectors" if not kv else "kept_slots": budget,
        "compression": e / budget,
        "mean": mean,
        "rows": rows,
        "checkpoint": str(args.checkpoint),
        "dtype": args.dtype,
    }
    print(
        json.dumps({"mean": {m: round(v, 4) for m, v in mean.items()}, "compression": e / budget})
    )
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
