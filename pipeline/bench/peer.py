"""The bench job's peer: the plain-transformers batch script a user would write instead of longdoc.

Run as a script (``python pipeline/bench/peer.py ...``) in a fresh process by
``longdoc bench job`` (pipeline/bench/job.py). It imports only the standard library,
torch, transformers and pyarrow, never the project, so it is what a user without
longdoc has; a test keeps it that way.

What it does, as a user would:
1. read the requests (a JSONL the bench writes: ``request_id``, ``doc_id``, ``text``,
   ``instruction``, ``question``: the documents of the spec, read by the project's
   reader so both sides see the same ones);
2. load the model (``--model`` path, or ``--random-config`` + ``--seed``: the same
   seeded random weights stages/random_models.py builds, allocated on the device);
3. build each prompt with the tokenizer's chat template around ``Document:\\n<text>\\n\\n
   <instruction>`` (+ ``\\n\\nQuestion: <question>``), the document tokenized on its
   own and cut to ``--truncate-tokens`` from both ends (``--keep head_tail``) when the
   spec truncates: the same token ids longdoc's prompt holds (stages/prompting.py);
4. batched greedy ``model.generate`` with left padding, rows stopping at EOS; on CUDA
   with ``cache_implementation="static"`` and transformers' compile config (CUDA graphs,
   "reduce-overhead"): prompts padded to a multiple of ``STATIC_PAD`` tokens and the last
   batch to the full batch size (its extra rows dropped), so the compiled step is reused;
5. write one Parquet file of the outputs.

Modes: ``--batch-size B`` runs every request in batches of B and writes ``--out``
(Parquet) and ``--timing`` (JSON: wall clock stamps ``t_start`` (script start),
``t_loaded``, ``t_first_batch``, ``t_written``; per batch its size and seconds;
``warm_up_s``; ``peak_gpu_bytes``). ``--probe 1,4,8`` times each candidate batch size
on the first ``--probe-docs`` requests (after a warm-up call of that size on CUDA, where
the first call compiles) and writes ``--timing`` with every candidate's documents/s
(or its error, e.g. out of memory) and the best.

Rows of the Parquet file: request_id, doc_id, output_text, output_tokens,
prompt_tokens, latency_s (the wall time of the row's batch), batch.
"""

from __future__ import annotations

import argparse
import json
import time

T_START = time.time()  # before torch/transformers load: the script's own start

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

PLACEHOLDER = "\u27e6DOCUMENT\u27e7"
STATIC_PAD = 256  # static cache: prompt widths rounded up to this, so few shapes compile
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", required=True, help="JSONL: request_id, doc_id, text, instruction, question")
    p.add_argument("--model", help="model directory or Hugging Face id")
    p.add_argument("--random-config", help="a config.json: build random weights (with --seed) instead")
    p.add_argument("--tokenizer", help="tokenizer directory (default: --model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU torch threads (0: torch's default)")
    p.add_argument("--truncate-tokens", type=int, default=0, help="keep this many document tokens (0: all)")
    p.add_argument("--keep", choices=("head", "tail", "head_tail"), default="head_tail")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--static-compile", choices=("auto", "on", "off"), default="auto",
                   help="static cache + torch.compile (auto: on CUDA only)")
    p.add_argument("--batch-size", type=int, help="run mode: the batch size")
    p.add_argument("--probe", help="probe mode: comma-separated candidate batch sizes")
    p.add_argument("--probe-docs", type=int, default=0, help="probe mode: requests timed per candidate")
    p.add_argument("--out", help="run mode: the output Parquet file")
    p.add_argument("--timing", required=True, help="the timing JSON to write")
    a = p.parse_args(argv)
    if (a.batch_size is None) == (a.probe is None):
        p.error("give exactly one of --batch-size (run) or --probe (probe)")
    if a.batch_size is not None and (a.batch_size < 1 or not a.out):
        p.error("run mode needs --batch-size >= 1 and --out")
    if (a.model is None) == (a.random_config is None):
        p.error("give exactly one of --model or --random-config")
    return a


# ----------------------------------------------------------------------------- model
def load(args: argparse.Namespace):
    """(model, tokenizer) on the device, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    tok = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if args.random_config:
        config = AutoConfig.from_pretrained(args.random_config)
        torch.manual_seed(args.seed)
        with torch.device(device):  # allocated on the device in its dtype, as the project does
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
        model.to(device)
    return model.eval(), tok


# ----------------------------------------------------------------------------- prompts
def keep_tokens(ids: list[int], target: int, keep: str) -> list[int]:
    """``target`` document tokens from the head, the tail or both ends (head gets the odd one)."""
    if target <= 0 or len(ids) <= target:
        return ids
    if keep == "head":
        return ids[:target]
    if keep == "tail":
        return ids[-target:]
    head = (target + 1) // 2
    return ids[:head] + (ids[len(ids) - (target - head):] if target - head else [])


def prompt_ids(tok, doc_ids: list[int], instruction: str, question: str | None) -> list[int]:
    """The chat prompt around the document: template text split at the document."""
    content = f"Document:\n{PLACEHOLDER}\n\n{instruction}" + (f"\n\nQuestion: {question}" if question else "")
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                       add_generation_prompt=True)
    else:
        text = f"{content}\n\nAnswer:"
    before, after = text.split(PLACEHOLDER)
    prefix = tok(before, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    if bos is not None and getattr(tok, "add_bos_token", False) and (not prefix or prefix[0] != bos):
        prefix = [bos] + prefix
    return prefix + doc_ids + tok(after, add_special_tokens=False)["input_ids"]


def read_requests(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tokenize(rows: list[dict], tok, args: argparse.Namespace) -> list[dict]:
    """``rows`` with ``ids``, their prompt (the document cut as ``--truncate-tokens`` says)."""
    for r in rows:
        if "ids" not in r:
            doc = keep_tokens(tok(r["text"], add_special_tokens=False)["input_ids"], args.truncate_tokens, args.keep)
            r["ids"] = prompt_ids(tok, doc, r["instruction"], r.get("question"))
    return rows


# ----------------------------------------------------------------------------- generation
def generation_config(model, tok, args: argparse.Namespace, static: bool):
    from transformers import GenerationConfig

    eos = {tok.eos_token_id}
    gen_eos = model.generation_config.eos_token_id
    eos |= set(gen_eos) if isinstance(gen_eos, list | tuple) else {gen_eos}
    eos.discard(None)
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, num_beams=1,
              pad_token_id=tok.pad_token_id, eos_token_id=sorted(eos))
    if not static:
        return GenerationConfig(**kw, disable_compile=True), eos
    import torch._dynamo
    from transformers import CompileConfig

    dyn = torch._dynamo.config  # one compiled step per batch size in a probe: room for them all
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(dyn, limit):
            setattr(dyn, limit, max(getattr(dyn, limit), 64))
    return GenerationConfig(**kw, cache_implementation="static", compile_config=CompileConfig()), eos


def generate(model, rows: list[dict], batch: int, gen, eos: set[int], pad: int, static: bool) -> list[list[int]]:
    """Greedy ``generate`` over ``rows`` (one batch, at most ``batch`` rows), left-padded: new ids per row."""
    ids = [r["ids"] for r in rows]
    if static:
        ids = ids + [ids[-1]] * (batch - len(ids))  # a full batch: the compiled shape is reused
    width = max(map(len, ids))
    if static:
        width = -(-width // STATIC_PAD) * STATIC_PAD
    device = next(model.parameters()).device
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device), generation_config=gen)
    news = []
    for row in out[: len(rows), width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        news.append(row[:cut])
    return news


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace, model, tok, rows: list[dict], static: bool) -> dict:
    """Every request in batches of ``--batch-size``; Parquet out; the timing record."""
    device = next(model.parameters()).device
    gen, eos = generation_config(model, tok, args, static)
    b = args.batch_size
    batches = [rows[i : i + b] for i in range(0, len(rows), b)]
    warm_up_s = 0.0
    if static and batches:  # the first call compiles: once, before the clock of the steady state
        t0 = time.time()
        generate(model, tokenize(batches[0], tok, args), b, gen, eos, tok.pad_token_id, static)
        sync(device)
        warm_up_s = time.time() - t0
    t_first = time.time()
    out_rows, timings = [], []
    for k, chunk in enumerate(batches):
        tokenize(chunk, tok, args)  # per batch, as the documents arrive
        t0 = time.perf_counter()
        news = generate(model, chunk, b, gen, eos, tok.pad_token_id, static)
        sync(device)
        spent = time.perf_counter() - t0
        timings.append({"size": len(chunk), "seconds": spent})
        for r, new in zip(chunk, news):
            out_rows.append({"request_id": r["request_id"], "doc_id": r["doc_id"],
                             "output_text": tok.decode(new, skip_special_tokens=True).strip(), "output_tokens": len(new),
                             "prompt_tokens": len(r["ids"]), "latency_s": spent, "batch": k})
    pq.write_table(pa.Table.from_pylist(out_rows), args.out)
    return {"mode": "run", "batch_size": b, "t_first_batch": t_first, "t_written": time.time(),
            "warm_up_s": warm_up_s, "batches": timings, "rows": len(out_rows)}


def probe(args: argparse.Namespace, model, tok, rows: list[dict], static: bool) -> dict:
    """Documents/s of each candidate batch size on the first ``--probe-docs`` requests."""
    device = next(model.parameters()).device
    gen, eos = generation_config(model, tok, args, static)
    sizes = [int(x) for x in args.probe.split(",") if x.strip()]
    sample = tokenize(rows[: max(1, args.probe_docs or max(sizes))], tok, args)
    if not static:  # one small call first: the first generate pays one-off set-up costs
        generate(model, sample[:1], 1, gen, eos, tok.pad_token_id, False)
    out = []
    for b in sizes:
        rec: dict = {"batch_size": b, "docs": len(sample)}
        try:
            if static:
                t0 = time.perf_counter()
                generate(model, sample[:b], b, gen, eos, tok.pad_token_id, True)
                sync(device)
                rec["warm_up_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(0, len(sample), b):
                generate(model, sample[i : i + b], b, gen, eos, tok.pad_token_id, static)
            sync(device)
            rec["seconds"] = time.perf_counter() - t0
            rec["docs_per_s"] = len(sample) / rec["seconds"]
            rec["status"] = "ok"
        except torch.OutOfMemoryError as e:  # too big for the device: the candidate is out
            rec.update(status="out of memory", error=str(e).splitlines()[0][:300])
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out.append(rec)
    ok = [r for r in out if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["docs_per_s"])["batch_size"] if ok else None
    return {"mode": "probe", "candidates": out, "best": best}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    static = args.static_compile == "on" or (args.static_compile == "auto" and device.type == "cuda")
    model, tok = load(args)
    t_loaded = time.time()
    rows = read_requests(args.requests)
    rec = probe(args, model, tok, rows, static) if args.probe else run(args, model, tok, rows, static)
    rec.update(t_start=T_START, t_loaded=t_loaded, static_compile=static, device=str(device), dtype=args.dtype,
               threads=torch.get_num_threads(),
               peak_gpu_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)
    with open(args.timing, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
