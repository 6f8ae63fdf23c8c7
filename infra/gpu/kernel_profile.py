"""Which kernels fill an eager decode step, or a prompt's prefill? (GPU diagnosis of the engine)

Decode (default): torch.profiler's kernels by total device time over 20 greedy steps of a
warmed eager engine (stages/decoding/engine.py, fixed slots; free slots, nothing
advances), and the device ms per step.

Prefill (``--prefill-tokens N``): the engine's own prefill of one random N-token prompt
into slot 0, chunk by chunk as the engine runs it (``chunk_tokens``: 4096 on CUDA), profiled
once after one unprofiled run; prints the device ms, tokens/s and the arithmetic rate
against an estimate of the prefill's FLOPs (2 x the non-embedding parameters per token for
the linear layers, the output head once, plus causal attention: 2 x 2 x N^2 / 2 x hidden
size per layer). Why: on an H100 (2026-11-27) an 8B night's prefill ran at ~22k tokens/s
over 8,000-token documents, ~36% of the GPU's dense bf16 rate by that estimate
(jobs/results/bench-job/README.md), and prefill is most of such a night.

On CUDA the kernels are the GPU's; ``--device cpu`` profiles the same work's CPU operators
(a dry run of this script, and what the CPU smoke test runs).

    python3 infra/gpu/kernel_profile.py --model random:smollm2-135m --slots 8 --capacity 1170
    python3 infra/gpu/kernel_profile.py --model random:llama-8b --dtype bfloat16 --slots 1 --capacity 8192 --prefill-tokens 8000
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from step_profile import engine_options  # this script's folder is on sys.path
from torch.profiler import ProfilerActivity, profile

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.model_loading import load_causal_lm

STEPS = 20


def prefill_flops(config, tokens: int) -> float:
    """Estimated FLOPs of prefilling ``tokens`` tokens of one prompt (see the module docstring)."""
    hidden, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    kv = hidden // config.num_attention_heads * config.num_key_value_heads
    per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * inter  # q, o; k, v; gate, up, down
    linear = 2 * per_layer * layers * tokens + 2 * hidden * config.vocab_size  # the head: last token only
    attention = 2 * 2 * tokens * tokens / 2 * hidden * layers  # QK^T and PV, causal
    return linear + attention


def _profile(run: Callable[[], None], repeats: int, cuda: bool) -> tuple[float, str]:
    """(device ms per run, kernel table) of ``repeats`` runs of ``run`` after one more unprofiled."""
    run()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            run()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    if cuda:
        kernels = [e for e in events if e.device_time_total > 0 and e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in kernels) / repeats / 1e3
    else:
        total = sum(e.self_cpu_time_total for e in events) / repeats / 1e3
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return total, events.table(sort_by=sort_by, row_limit=18, max_name_column_width=70)


def main(argv: list[str] | None = None) -> dict:
    ap = engine_options(__doc__)
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--prefill-tokens", type=int, default=0, help="profile one prompt's prefill instead of decode steps")
    ap.add_argument("--device", default="cuda", help="cpu: profile the CPU operators instead")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    model, _ = load_causal_lm(a.model, a.dtype, dev)
    cfg = DecodeConfig(max_new_tokens=64, eos_ids=frozenset(), speculative="prompt_lookup", num_draft_tokens=7)
    engine = Engine(model, cfg, slots=a.slots, expected_tokens=a.capacity - 64 - 9, compile="off")
    where = f"{a.model} {a.dtype} slots {a.slots} x {engine.cache.capacity}"
    if a.prefill_tokens:
        if a.prefill_tokens > engine.cache.capacity:
            raise SystemExit(f"--prefill-tokens {a.prefill_tokens}: more than a slot's {engine.cache.capacity} tokens "
                             "(raise --capacity)")
        ids = torch.randint(10, model.config.vocab_size, (a.prefill_tokens,), device=dev)

        def prefill() -> None:  # as Engine._prefill_chunk runs a row's chunks
            engine.cache.free(0)
            writer = engine.cache.row_writer(0)
            for start in range(0, ids.numel(), engine.chunk_tokens):
                chunk = ids[start : start + engine.chunk_tokens]
                engine.step_fn.prefill(writer, chunk, start)
                writer.commit(chunk.numel(), start + chunk.numel())

        with torch.inference_mode():
            total, table = _profile(prefill, 1, cuda)
        rate = prefill_flops(model.config, a.prefill_tokens) / (total / 1e3) / 1e12
        print(f"{where} prefill of {a.prefill_tokens} tokens in chunks of {engine.chunk_tokens}: "
              f"{'GPU' if cuda else 'CPU'} {total:.1f} ms, {a.prefill_tokens / total * 1e3:,.0f} tokens/s, "
              f"~{rate:.1f} TFLOP/s by the FLOPs estimate")
        print(table)
        return {"prefill_ms": total, "tokens_per_s": a.prefill_tokens / total * 1e3, "tflops": rate, "table": table}
    feed = torch.zeros((a.slots, a.width), dtype=torch.long, device=dev)
    n_fed = torch.full((a.slots,), a.width, dtype=torch.long, device=dev)
    for _ in range(2):  # with _profile's unprofiled run: three warm-up steps
        engine.step_fn.greedy(feed, n_fed)
    total, table = _profile(lambda: engine.step_fn.greedy(feed, n_fed)[1].tolist(), STEPS, cuda)
    print(f"{where} width {a.width}: {'GPU' if cuda else 'CPU'} {total:.2f} ms per step")
    print(table)
    return {"ms_per_step": total, "table": table}


if __name__ == "__main__":
    main()
