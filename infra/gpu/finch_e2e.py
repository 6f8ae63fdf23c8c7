"""Finch end to end vs full context: prefill (or compress) + decode N tokens, one document.

The target: Finch 8k -> 1k on the GPU, end to end (compress + decode 128), <= 0.7x
full-context prefill + decode. `longdoc bench compress` times the prefill alone; this
adds the decode, through the same engine for both rows.

One long document of ``--doc-tokens`` tokens (the texts of ``--corpus`` concatenated in
name order, pipeline.bench.compress.corpus_tokens), wrapped as a summary prompt. Per
repeat, interleaved: ``full`` = prefill_full of the whole prompt, then greedy decode of
``--new-tokens`` tokens (EOS ignored: fixed work); ``finch`` = finch_prefill to
``--target`` KV entries (chunk ``--chunk``, the spec defaults otherwise: calibrated heads,
early exit), then the same decode. Both run on the decode engine (stages/decoding/engine.py),
one slot with capacity for the full prompt, steps compiled per ``--compile`` (its warm-up
is reported, never timed): ``full`` through the engine's own prefill, ``finch`` through
Finch's prefill as the method's strategy.
Times are wall seconds after a device synchronize; the figures are medians over
``--repeats`` after one warm-up call of each. Writes ``--out`` (JSON) and prints a
Markdown table.

    python3 infra/gpu/finch_e2e.py --device cuda --doc-tokens 8000 --target 1024 --out finch-e2e.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

# Run as a script from the repository root: make its packages importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.bench.compress import corpus_tokens  # noqa: E402
from schemas.spec import DEFAULT_SUMMARY_INSTRUCTION, EMBEDDED_MODEL  # noqa: E402
from stages.compression.finch import FinchCompression  # noqa: E402
from stages.decoding.config import DecodeConfig  # noqa: E402
from stages.decoding.engine import Engine  # noqa: E402
from stages.decoding.request import Request
from stages.decoding.state import CompressedPrefill  # noqa: E402
from stages.finch import finch_prefill  # noqa: E402
from stages.finch.spans import sentence_boundaries  # noqa: E402
from stages.model_loading import load_causal_lm  # noqa: E402
from stages.prompting import PromptBuilder  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--model", default=EMBEDDED_MODEL)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--doc-tokens", type=int, default=8000)
    ap.add_argument("--target", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", default="auto", help="the engine's steps: auto | inductor | cudagraphs | off")
    ap.add_argument("--min-span", type=int, default=1024,
                    help="smallest attention span of a compiled step (fewer spans, fewer shapes to compile)")
    ap.add_argument("--corpus", default="jobs/corpus")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.new_tokens < 1 or a.target < 1:
        raise ValueError(f"--repeats {a.repeats}, --new-tokens {a.new_tokens}, --target {a.target}: allowed: >= 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to torch")
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)

    lm, tok = load_causal_lm(a.model, a.dtype, device)
    builder = PromptBuilder(tok)
    parts = builder.build(corpus_tokens(a.corpus, a.doc_tokens, builder), DEFAULT_SUMMARY_INSTRUCTION, None)
    window = int(lm.config.max_position_embeddings)
    if len(parts) > window:
        raise ValueError(f"--doc-tokens {a.doc_tokens}: the prompt is {len(parts)} tokens, over the model's "
                         f"window {window}; full prefill would run past it")
    pad = tok.pad_token_id
    bounds = sentence_boundaries(tok)  # keep: sentences, the early-exit default
    finch_cfg = FinchCompression(target_tokens=a.target, chunk_tokens=a.chunk).resolved("summarize")
    cfg = DecodeConfig(max_new_tokens=a.new_tokens, eos_ids=frozenset())  # fixed work
    lookups = [list(parts.full_ids)]

    times = {"prefill_s": 0.0}

    def finch(parts_: list, on_chunk=None) -> CompressedPrefill:
        _sync(device)
        t = time.perf_counter()
        out = finch_prefill(lm, parts_, finch_cfg, pad, boundaries=bounds)
        _sync(device)
        times["prefill_s"] += time.perf_counter() - t
        return out

    t0 = time.perf_counter()
    engines = {
        m: Engine(lm, cfg, prefill=prefill, slots=1, expected_tokens=len(parts), compile=a.compile,
                  min_span=a.min_span, chunk_tokens=len(parts))
        for m, prefill in (("full", None), ("finch", finch))
    }
    for eng in engines.values():
        eng.warm_up(greedy=True)
    _sync(device)
    warm_up_s = time.perf_counter() - t0
    how = engines["full"].describe()

    def one(method: str) -> dict:
        eng = engines[method]
        times["prefill_s"] = 0.0
        before = eng.stats.prefill_s
        _sync(device)
        t0 = time.perf_counter()
        [done] = eng.run([Request(0, parts, lookups[0])])
        if done.error is not None:
            raise done.error
        _sync(device)
        total = time.perf_counter() - t0
        # The engine's own prefill is timed by the engine; Finch's by its wrapper above.
        pre = times["prefill_s"] if method == "finch" else eng.stats.prefill_s - before
        tokens = done.result.tokens
        return {"e2e_s": total, "prefill_s": pre, "decode_s": total - pre,
                "new_tokens": len(tokens), "head": tok.decode(tokens[:24])}

    for method in ("full", "finch"):  # warm-up: kernels, allocator, the calibrated heads file
        one(method)
    runs: dict[str, list[dict]] = {"full": [], "finch": []}
    for _ in range(a.repeats):
        for method in ("full", "finch"):
            runs[method].append(one(method))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("e2e_s", "prefill_s", "decode_s")}
           for m, rs in runs.items()}
    ratio = med["finch"]["e2e_s"] / med["full"]["e2e_s"]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "model": a.model, "dtype": str(next(lm.parameters()).dtype),
        "prompt_tokens": len(parts), "doc_tokens": a.doc_tokens, "target": a.target, "chunk": a.chunk,
        "new_tokens": a.new_tokens, "repeats": a.repeats, "engine": how, "warm_up_s": round(warm_up_s, 2),
        "median": med, "finch_over_full_e2e": ratio, "target_met": ratio <= 0.7, "runs": runs,
        "command": " ".join(sys.argv),
    }
    print(f"# Finch end to end on {result['device']} ({result['dtype']}, {how}, warm-up {warm_up_s:.1f} s)")
    print(f"{len(parts)}-token prompt, Finch -> {a.target} (chunk {a.chunk}), {a.new_tokens} new tokens, "
          f"median of {a.repeats}")
    print("| method | prefill/compress s | decode s | end to end s |\n|---|---:|---:|---:|")
    for m in ("full", "finch"):
        print(f"| {m} | {med[m]['prefill_s']:.3f} | {med[m]['decode_s']:.3f} | {med[m]['e2e_s']:.3f} |")
    print(f"finch / full end to end: {ratio:.2f}x (target <= 0.7x: {'met' if ratio <= 0.7 else 'NOT met'})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
