"""Where does an engine's warm-up go? (GPU diagnosis of the captured steps' start)

Why: on an H100 (2026-11-27, jobs/results/bench-job/README.md, second session) a queue of
the embedded model took 7.3 s to build and warm up greedy and 17.1 s with prompt lookup,
whose wider verify steps need 160 captured graphs (8 batch buckets x widths 1/4/8/17 x 5
spans) against 40; with imports of 12-16 s, prompt lookup could then reach at most 0.89x
greedy as a whole process. This script says what one warm-up spends per shape, so the
next change to it is chosen on figures: the seconds of each shape's first call (on CUDA
with captured steps: an eager run plus the capture), of its later calls, and the seconds
inside ``torch.cuda.empty_cache`` (``torch.cuda.graph`` empties the allocator's cache at
every capture, so the next shape allocates its temporaries again).

    python3 infra/gpu/warmup_profile.py --model random:smollm2-135m --slots 256 --capacity 2304
    python3 infra/gpu/warmup_profile.py --device cpu --model random:tiny --slots 4 --capacity 64  # dry run

Contract: ``main(argv) -> dict`` builds one engine per ``--speculative`` choice with fixed
slots (``--slots`` x ``--capacity``, random weights: the cost of a shape does not depend on
them) and runs the warm-up the engine runs (``SlotStep.warm_up`` over its batch buckets
and width buckets, in its order), timing every call. On CPU, where engines do not warm up
(eager steps take exact shapes), it runs the same shapes eagerly: a dry run of the script.
Prints one line per choice and returns ``{"runs": [{"speculative", "engine", "warm_up_s",
"spans", "shapes", "first_call_s", "later_calls_s", "empty_cache_s", "empty_cache_calls",
"by_width": {width: seconds}, "slowest": [[batch, width, span, seconds], ...]}]}``.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.slot_step import batch_buckets, width_buckets
from stages.model_loading import load_causal_lm


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile_warm_up(engine: Engine, device: torch.device) -> dict:
    """Time each call of ``engine``'s warm-up (see the module contract)."""
    step = engine.step_fn
    calls: list[tuple[int, int, int, float]] = []  # (batch, width, span, seconds), in call order
    real_greedy, real_empty = step.greedy, torch.cuda.empty_cache
    emptied = [0.0, 0]

    def timed_greedy(feed: torch.Tensor, n_fed: torch.Tensor, span: int | None = None):
        _sync(device)
        t = time.perf_counter()
        out = real_greedy(feed, n_fed, span)
        _sync(device)
        calls.append((feed.shape[0], feed.shape[1], span or engine.cache.capacity, time.perf_counter() - t))
        return out

    def timed_empty() -> None:
        t = time.perf_counter()
        real_empty()
        emptied[0] += time.perf_counter() - t
        emptied[1] += 1

    widths = width_buckets(engine.k_max)  # what a compiled engine warms up (an eager one: none)
    step.greedy, torch.cuda.empty_cache = timed_greedy, timed_empty
    try:
        t0 = time.perf_counter()
        step.warm_up(batch_buckets(engine.cache.slots), widths, greedy=True)
        _sync(device)
        total = time.perf_counter() - t0
    finally:
        step.greedy, torch.cuda.empty_cache = real_greedy, real_empty
    first: dict[tuple[int, int, int], float] = {}
    later = 0.0
    by_width: dict[int, float] = defaultdict(float)
    for b, w, span, s in calls:
        by_width[w] += s
        if (b, w, span) in first:
            later += s
        else:
            first[(b, w, span)] = s
    slowest = sorted(first.items(), key=lambda kv: kv[1], reverse=True)[:8]
    return {"warm_up_s": total, "spans": list(step.spans), "shapes": len(first), "first_call_s": sum(first.values()), "later_calls_s": later,
            "empty_cache_s": emptied[0], "empty_cache_calls": emptied[1], "by_width": dict(by_width),
            "slowest": [[*shape, s] for shape, s in slowest]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:smollm2-135m", help="random:<shape> (stages/random_models.py)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--capacity", type=int, default=2304)
    ap.add_argument("--speculative", default="none,prompt_lookup", help="comma list: the engines to warm up")
    ap.add_argument("--num-draft-tokens", type=int, default=16, help="the spec's default: widths 1, 4, 8, 17")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (eager shapes, no capture)")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    model, _ = load_causal_lm(a.model, a.dtype, dev)
    compile_choice = "cudagraphs" if dev.type == "cuda" else "off"
    runs = []
    for choice in a.speculative.split(","):
        cfg = DecodeConfig(max_new_tokens=64, eos_ids=frozenset(), speculative=choice,
                           num_draft_tokens=a.num_draft_tokens)
        engine = Engine(model, cfg, slots=a.slots, expected_tokens=a.capacity - 64 - a.num_draft_tokens - 1,
                        compile=compile_choice)
        run = {"speculative": choice, "engine": engine.describe(), **profile_warm_up(engine, dev)}
        print(f"{choice}: {run['shapes']} shapes, warm-up {run['warm_up_s']:.2f} s (first calls "
              f"{run['first_call_s']:.2f} s, later calls {run['later_calls_s']:.2f} s, empty_cache "
              f"{run['empty_cache_s']:.2f} s in {run['empty_cache_calls']} calls); by width "
              + ", ".join(f"{w}: {s:.2f} s" for w, s in sorted(run["by_width"].items()))
              + f"; {run['engine']}", flush=True)
        runs.append(run)
        del engine
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": a.model, "dtype": a.dtype, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "runs": runs}


if __name__ == "__main__":
    main()
