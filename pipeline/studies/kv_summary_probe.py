"""Do key/value summaries carry a page's content where summary vectors did not? (CPU probe)

The AutoCompressor feeds its summaries back as input embeddings; on this machine they
learned to carry almost nothing of their own page (README, "Autoencoding objective"). This
probe asks the same of the other published form, summaries kept as every layer's keys and
values (gist tokens, Mu et al. 2023; Activation Beacon, Zhang et al. 2024; 500xCompressor,
Li et al. 2024), in one masked pass: ``[earlier (1024) with summary slots ; cont (256)]``,
where the continuation attends to the summary slots and itself only, never to the
earlier tokens. Same held-out pages, same targets (cont[1:], mean nats/token) and the same
~10x budget as autocompressor_heldout.py. Layouts (``--layout``):
- end:         K learned gist embeddings after the page (K = 1024 / stride).
- interleaved: one learned gist embedding after every ``stride`` tokens (the beacon layout).
- stride:      no gist; the keys/values of every ``stride``-th page token are kept.
Trainable: LoRA (q/v/o, r=8) + the gist embeddings; objective: the continuation's loss.
Reported at each evaluation: ``own`` (the page's own earlier text) and ``other`` (the next
held-out page's earlier text, same continuation); own = other means the summaries carry
nothing of their page. ``--steps 0`` evaluates the untrained base model.

    .venv/bin/python -m pipeline.studies.kv_summary_probe --layout interleaved --steps 300 --out out/kv

Results: jobs/results/autocompressor/kv_probe_*.{csv,json} (README.md there, "Key/value
summaries, a CPU probe"). ``--earlier``/``--cont`` change the 1024/256 split (the smoke test
uses a small one).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from schemas.spec import EMBEDDED_MODEL
from stages.model_loading import load_causal_lm

EARLIER, CONT = 1024, 256


def summary_slots(layout: str, stride: int, earlier: int = EARLIER) -> torch.Tensor:
    """Which slots of the earlier part the continuation may read: [N] bool (N = earlier + gists)."""
    k = earlier // stride
    if layout == "end":
        return torch.cat([torch.zeros(earlier, dtype=torch.bool), torch.ones(k, dtype=torch.bool)])
    if layout == "interleaved":  # every (stride + 1)-th slot is a gist, after its stride tokens
        slots = torch.zeros(earlier + k, dtype=torch.bool)
        slots[stride :: stride + 1] = True
        return slots
    slots = torch.zeros(earlier, dtype=torch.bool)
    slots[stride - 1 :: stride] = True
    return slots


def token_ids(tok, path: Path) -> list[list[int]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [tok(json.loads(line)["text"], add_special_tokens=False).input_ids for line in lines]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=("end", "interleaved", "stride"), required=True)
    ap.add_argument("--stride", type=int, default=10, help="earlier tokens per summary slot")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3, help="LoRA learning rate")
    ap.add_argument("--gist-lr", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--init-token", default=".", help="gist embeddings start as this token's")
    ap.add_argument("--corpus", type=Path, default=Path("out/ac-corpus"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way)")
    ap.add_argument("--batch", type=int, default=1, help="training windows per step")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.csv (loss per step), OUT.json")
    ap.add_argument("--model", default=EMBEDDED_MODEL)
    ap.add_argument("--earlier", type=int, default=EARLIER, help="page tokens the summaries stand for")
    ap.add_argument("--cont", type=int, default=CONT, help="continuation tokens scored")
    a = ap.parse_args(argv)
    earlier_n, cont_n = a.earlier, a.cont
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    lm, tok = load_causal_lm(a.model, "float32", dev)
    cache = a.corpus / "train_ids.pt"  # the training pages, tokenized once, EOS between pages
    if not cache.exists():
        flat = [t for page in token_ids(tok, a.corpus / "train.jsonl") for t in page + [tok.eos_token_id]]
        torch.save(torch.tensor(flat), cache)
    data = torch.load(cache)
    held = [p for p in token_ids(tok, a.corpus / "heldout.jsonl") if len(p) >= earlier_n + cont_n]
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(lm, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"]))
    model = lm.get_base_model()
    embed = model.get_input_embeddings()
    slots = summary_slots(a.layout, a.stride, earlier_n).to(dev)
    n_gist = int(slots.sum()) if a.layout == "end" else 1
    start = embed.weight[tok(a.init_token, add_special_tokens=False).input_ids[0]].detach()
    gist = torch.nn.Parameter(start[None].repeat(n_gist, 1).clone())  # [G, H], on dev
    lora = [p for p in lm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": lora, "lr": a.lr}, {"params": [gist], "lr": a.gist_lr}], weight_decay=0.0)
    cosine = lambda s: min(1, (s + 1) / a.warmup) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / max(1, a.steps)))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine)
    n = slots.numel()
    is_gist = slots if a.layout != "stride" else torch.zeros(n, dtype=torch.bool, device=dev)
    mask = torch.ones(n + cont_n, n + cont_n, dtype=torch.bool, device=dev).tril()
    mask[n:, :n] &= slots[None, :]  # the continuation reads the summary slots only
    mask = mask[None, None]
    pos = torch.arange(n + cont_n, device=dev)[None]

    def inputs(earlier: list[int], cont: list[int]) -> torch.Tensor:
        """One sequence's input embeddings: [n + cont, H] (page with summary slots ; cont)."""
        text = embed(torch.tensor(earlier, device=dev))  # [earlier, H]
        x = torch.zeros(n, text.shape[1], device=dev).masked_scatter(~is_gist[:, None], text)
        if a.layout != "stride":
            x = torch.where(is_gist[:, None], torch.zeros_like(x), x)
            x[is_gist] = gist if a.layout == "end" else gist.expand(int(is_gist.sum()), -1)
        return torch.cat([x, embed(torch.tensor(cont, device=dev))])

    def cont_loss(pairs: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Mean loss of cont[1:] over the batch, each cont reading its page's summary slots."""
        x = torch.stack([inputs(e, c) for e, c in pairs])  # [B, n + cont, H]
        b = x.shape[0]
        h = model.model(inputs_embeds=x, attention_mask=mask.expand(b, -1, -1, -1), position_ids=pos.expand(b, -1),
                        use_cache=False).last_hidden_state
        logits = model.lm_head(h[:, n : n + cont_n - 1]).float()  # [B, cont - 1, V]
        target = torch.tensor([c[1:] for _, c in pairs], device=dev)
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())

    @torch.no_grad()
    def evaluate(step: int) -> dict:
        lm.eval()
        own = [cont_loss([(p[:earlier_n], p[earlier_n : earlier_n + cont_n])]).item() for p in held]
        other = [cont_loss([(held[(i + 1) % len(held)][:earlier_n], p[earlier_n : earlier_n + cont_n])]).item()
                 for i, p in enumerate(held)]
        lm.train()
        row = {"step": step, "own": sum(own) / len(own), "other": sum(other) / len(other)}
        print(json.dumps(row), flush=True)
        return row

    evals = [evaluate(0)]
    with open(f"{a.out}.csv", "w") as log:
        log.write("step,loss,seconds\n")
        for step in range(1, a.steps + 1):
            t0 = time.time()
            windows = []
            for _ in range(a.batch):
                i = random.randrange(0, len(data) - earlier_n - cont_n)
                w = data[i : i + earlier_n + cont_n].tolist()
                windows.append((w[:earlier_n], w[earlier_n:]))
            loss = cont_loss(windows)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lora + [gist], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            log.write(f"{step},{loss.item():.4f},{time.time() - t0:.2f}\n")
            log.flush()
            if step % a.eval_every == 0 or step == a.steps:
                evals.append(evaluate(step))
    result = {"args": {k: str(v) for k, v in vars(a).items()}, "evals": evals}
    Path(f"{a.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
