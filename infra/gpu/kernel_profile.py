"""Which kernels fill an eager static-engine decode step? (GPU diagnosis for issue 12)

Prints torch.profiler's CUDA kernels by total GPU time over 20 greedy steps of a warmed
eager SlotEngine (free slots, nothing advances), and the GPU ms per step.

    python3 infra/gpu/kernel_profile.py --model random:smollm2-135m --slots 8 --capacity 1170
"""

from __future__ import annotations

import torch
from step_profile import engine_options  # this script's folder is on sys.path
from torch.profiler import ProfilerActivity, profile

from stages.decoding.slot_engine import SlotEngine
from stages.model_loading import load_causal_lm


def main() -> None:
    ap = engine_options(__doc__)
    ap.add_argument("--width", type=int, default=1)
    a = ap.parse_args()
    model, _ = load_causal_lm(a.model, a.dtype, torch.device("cuda"))
    engine = SlotEngine(model, slots=a.slots, max_drafts=7, capacity=a.capacity, compile="off")
    feed = torch.zeros((a.slots, a.width), dtype=torch.long, device="cuda")
    n_fed = torch.full((a.slots,), a.width, dtype=torch.long, device="cuda")
    for _ in range(3):
        engine.step.greedy(feed, n_fed)
    torch.cuda.synchronize()
    n = 20
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            engine.step.greedy(feed, n_fed)[1].tolist()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in rows) / n / 1e3
    print(f"{a.model} {a.dtype} slots {a.slots} x {a.capacity} width {a.width}: GPU {total:.2f} ms per step")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=70))


if __name__ == "__main__":
    main()
