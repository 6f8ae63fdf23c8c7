"""Which kernels fill an eager decode step? (GPU diagnosis of the engine's step)

Prints torch.profiler's kernels by total device time over 20 greedy steps of a warmed
eager engine (stages/decoding/engine.py, fixed slots; free slots, nothing advances), and
the device ms per step. On CUDA the
kernels are the GPU's; ``--device cpu`` profiles the same steps' CPU operators (a dry run
of this script, and what the CPU smoke test runs).

    python3 infra/gpu/kernel_profile.py --model random:smollm2-135m --slots 8 --capacity 1170
"""

from __future__ import annotations

import torch
from step_profile import engine_options  # this script's folder is on sys.path
from torch.profiler import ProfilerActivity, profile

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.model_loading import load_causal_lm

STEPS = 20


def main(argv: list[str] | None = None) -> dict:
    ap = engine_options(__doc__)
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="cpu: profile the CPU operators instead")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    model, _ = load_causal_lm(a.model, a.dtype, dev)
    cfg = DecodeConfig(max_new_tokens=64, eos_ids=frozenset(), speculative="prompt_lookup", num_draft_tokens=7)
    engine = Engine(model, cfg, slots=a.slots, expected_tokens=a.capacity - 64 - 9, compile="off")
    feed = torch.zeros((a.slots, a.width), dtype=torch.long, device=dev)
    n_fed = torch.full((a.slots,), a.width, dtype=torch.long, device=dev)
    for _ in range(3):
        engine.step_fn.greedy(feed, n_fed)
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(STEPS):
            engine.step_fn.greedy(feed, n_fed)[1].tolist()
    events = prof.key_averages()
    if cuda:
        kernels = [e for e in events if e.device_time_total > 0 and e.device_type.name == "CUDA"]
        total = sum(e.self_device_time_total for e in kernels) / STEPS / 1e3
    else:
        total = sum(e.self_cpu_time_total for e in events) / STEPS / 1e3
    sort_by = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = events.table(sort_by=sort_by, row_limit=18, max_name_column_width=70)
    print(f"{a.model} {a.dtype} slots {a.slots} x {a.capacity} width {a.width}: "
          f"{'GPU' if cuda else 'CPU'} {total:.2f} ms per step")
    print(table)
    return {"ms_per_step": total, "table": table}


if __name__ == "__main__":
    main()
