"""Where does a decode step's time go? (GPU diagnosis of the engine's step)

For one random-weight model and each compile choice, on free slots of a warmed engine
(stages/decoding/engine.py, fixed slots):
- ``async_ms``: greedy steps issued back to back, one synchronize at the end (what the
  GPU needs per step when the host keeps ahead),
- ``sync_ms``: the same with the engine's one host transfer per step (``.tolist()``),
- ``engine_ms``: ``Engine.run`` on real prompts, (wall seconds - its prefill) / steps
  (host drafting, bookkeeping and the cache's advance included),
- ``launches``: CUDA API calls per bare step seen by torch.profiler (a replayed graph is
  one ``cudaGraphLaunch``; hundreds of ``cudaLaunchKernel`` mean no graph was replayed).

    python3 infra/gpu/step_profile.py --model random:smollm2-135m --dtype float32 \
        --slots 8 --capacity 1170 --compile cudagraphs,inductor --out step.json

``--device cpu --compile off`` is a dry run on the CPU (what the CPU smoke test runs).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.request import Request
from stages.decoding.slot_step import batch_buckets
from stages.model_loading import load_causal_lm
from stages.prompting import PromptParts


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bare_steps(engine: Engine, batch: int, width: int, n: int, host_sync: bool) -> float:
    """ms per greedy step over ``batch`` free slots (nothing advances: the slots stay free)."""
    feed = torch.zeros((batch, width), dtype=torch.long, device=engine.device)
    n_fed = torch.full((batch,), width, dtype=torch.long, device=engine.device)
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        best, acc = engine.step_fn.greedy(feed, n_fed)
        if host_sync:
            torch.cat([acc[:, None], best], dim=1).tolist()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def api_calls(engine: Engine, batch: int, width: int, n: int = 5) -> dict[str, float]:
    """CUDA runtime calls per bare step, by name (launch-like calls only)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = [ProfilerActivity.CUDA] if engine.device.type == "cuda" else []
    with profile(activities=[ProfilerActivity.CPU, *cuda]) as prof:
        bare_steps(engine, batch, width, n, host_sync=True)
    calls: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.key.startswith("cuda") and ("Launch" in ev.key or "Memcpy" in ev.key or "Synchronize" in ev.key):
            calls[ev.key] = ev.count / n
    return calls


def engine_options(doc: str) -> argparse.ArgumentParser:
    """The options both GPU diagnosis scripts take: a random model and the engine's slots."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", default="random:smollm2-135m", help="random:<shape> (stages/random_models.py)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=1170)
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = engine_options(__doc__)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--compile", default="cudagraphs,inductor")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    model, _ = load_causal_lm(a.model, a.dtype, dev)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(10, vocab, (a.prompt_tokens,), generator=gen).tolist() for _ in range(a.slots)]
    report = {"model": a.model, "dtype": a.dtype, "slots": a.slots, "capacity": a.capacity,
              "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__, "runs": []}
    for choice in a.compile.split(","):
        t0 = time.perf_counter()
        cfg = DecodeConfig(max_new_tokens=a.new_tokens, eos_ids=frozenset(), speculative="prompt_lookup",
                           num_draft_tokens=7)
        engine = Engine(model, cfg, slots=a.slots, expected_tokens=a.capacity - a.new_tokens - 9, compile=choice)
        engine.warm_up(greedy=True)
        sync()
        run = {"compile": choice, "engine": engine.describe(), "warm_up_s": time.perf_counter() - t0, "bare": []}
        buckets = batch_buckets(a.slots)
        sizes = sorted({buckets[0], buckets[-1]})  # compiled batch buckets
        for b in sizes:
            for w in (1, 8):
                run["bare"].append({
                    "batch": b, "width": w,
                    "async_ms": bare_steps(engine, b, w, 50, host_sync=False),
                    "sync_ms": bare_steps(engine, b, w, 50, host_sync=True),
                    "calls_per_step": api_calls(engine, b, w),
                })
        engine.configure(DecodeConfig(max_new_tokens=a.new_tokens, eos_ids=frozenset()))
        for b in sorted({1, a.slots}):  # a compiled engine pads a batch to its bucket
            reqs = [Request(i, PromptParts([], prompts[i], []), prompts[i]) for i in range(b)]
            engine.run(reqs)  # warm (first-run allocations)
            sync()
            before = engine.stats.prefill_s
            t = time.perf_counter()
            res = [f.result for f in engine.run(reqs)]
            sync()
            steps = max(r.decode_steps for r in res)
            decode_s = time.perf_counter() - t - (engine.stats.prefill_s - before)
            run[f"engine_ms_b{b}"] = decode_s / steps * 1e3
        print(json.dumps(run), flush=True)
        report["runs"].append(run)
        del engine
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
