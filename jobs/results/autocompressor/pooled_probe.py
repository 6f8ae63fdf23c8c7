"""Can the frozen base model read content from soft vectors at all? (training-free probe)

Each held-out page's first 1024 tokens are fed as a soft prompt of their token embeddings
mean-pooled ``w`` per vector (1024/w vectors) to the BASE model, and the next 256 tokens are
scored (mean nats per token, tokens 1..255), beside the same with another page's pooled
embeddings. w = 1 is the full context (a check: it must equal nll_check's ``full``).

    .venv/bin/python jobs/results/autocompressor/pooled_probe.py --windows 1,4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from schemas.spec import EMBEDDED_MODEL
from stages.autocompressor.model import ACConfig, AutoCompressor
from stages.model_loading import load_causal_lm

EARLIER, CONT = 1024, 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=Path, default=Path("out/ac-corpus/heldout.jsonl"))
    ap.add_argument("--windows", default="1,4", help="comma-separated pooling widths (divide 1024)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm, tok = load_causal_lm(EMBEDDED_MODEL, "float32", torch.device("cpu"))
    ac = AutoCompressor(lm.eval(), ACConfig(summary_length=1))  # used for its soft-prompt pass
    docs = [json.loads(line)["text"] for line in args.docs.read_text(encoding="utf-8").splitlines()]
    ids = [tok(d, add_special_tokens=False).input_ids for d in docs]
    ids = [d for d in ids if len(d) >= EARLIER + CONT]

    @torch.no_grad()
    def pooled(tokens: list[int], w: int) -> torch.Tensor:  # -> [1, 1024 / w, H]
        emb = ac.embed(torch.tensor([tokens]))
        return emb.reshape(1, len(tokens) // w, w, -1).mean(2)

    @torch.no_grad()
    def nll(soft: torch.Tensor, cont: list[int]) -> float:
        return ac(torch.tensor([cont]), [len(cont)], softprompt=soft, loss_from=1).loss.item()

    for w in (int(x) for x in args.windows.split(",")):
        if EARLIER % w:
            raise ValueError(f"--windows: {w} does not divide {EARLIER}")
        own = [nll(pooled(d[:EARLIER], w), d[EARLIER : EARLIER + CONT]) for d in ids]
        other = [
            nll(pooled(ids[(i + 1) % len(ids)][:EARLIER], w), d[EARLIER : EARLIER + CONT])
            for i, d in enumerate(ids)
        ]
        print(json.dumps({"window": w, "own": sum(own) / len(own), "other": sum(other) / len(other)}))


if __name__ == "__main__":
    main()
