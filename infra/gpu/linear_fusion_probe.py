"""What would fusing a decode step's linear layers buy? (GPU diagnosis of the weight reads)

A Llama layer's decode step runs seven products: q, k, v, o, gate, up, down. Three of
them read the same input (q, k, v) and two others too (gate, up), so each pair or triple
could be one product over concatenated weights: fewer, larger kernels reading the same
bytes. This probe times one step's linear layers (every layer of ``--model``'s shape,
the output head left out: it is one product either way) both ways, on random weights of
the model's shapes, at each ``--batch-sizes`` token count, and reports milliseconds and
the bandwidth they reach (weight bytes / time; at small batches the products are bound by
reading the weights).

On CUDA each way is captured as one CUDA graph and replayed (no launch cost, as the
engine's captured steps); time = CUDA events over ``--repeats`` replays. On CPU it runs
eagerly (a dry run of this script: the CPU smoke test runs it with ``random:tiny``).

    python3 infra/gpu/linear_fusion_probe.py --model random:llama-8b --dtype bfloat16 --batch-sizes 1,8,32

Output: one JSON line per batch size (also returned by ``main``): ``separate_ms``,
``fused_ms``, ``weights_gb``, ``separate_gb_s``, ``fused_gb_s``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from stages.random_models import shape_of


def layer_weights(shape, dtype: torch.dtype, device: torch.device, fused: bool) -> list[torch.Tensor]:
    """One layer's weight matrices [out, in]: q, k, v, o, gate, up, down, or fused
    [q|k|v], o, [gate|up], down."""
    h, i = shape.hidden_size, shape.intermediate_size
    kv = h // shape.num_attention_heads * shape.num_key_value_heads

    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=device, dtype=dtype) * 0.01

    if fused:
        return [w(h + 2 * kv, h), w(h, h), w(2 * i, h), w(h, i)]
    return [w(h, h), w(kv, h), w(kv, h), w(h, h), w(i, h), w(i, h), w(h, i)]


def step_fn(layers: list[list[torch.Tensor]], x: torch.Tensor, x_inter: torch.Tensor) -> Callable[[], None]:
    """Every layer's products: x [M, hidden] into all but the last, x_inter [M, inter] into
    the last (down). The outputs are discarded: only the weight reads are timed."""

    def run() -> None:
        for weights in layers:
            for w in weights[:-1]:
                F.linear(x, w)
            F.linear(x_inter, weights[-1])

    return run


def time_ms(run: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Milliseconds per call of ``run``: CUDA = a captured graph's replays, CPU = eager calls."""
    if device.type != "cuda":
        run()
        t0 = time.perf_counter()
        for _ in range(repeats):
            run()
        return (time.perf_counter() - t0) * 1e3 / repeats
    run()  # warm cuBLAS up outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:llama-8b", help="random:<shape> (stages/random_models.py)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-sizes", default="1,8,32", help="tokens per step (rows x width)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    a = ap.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    shape = shape_of(a.model)
    layers = {fused: [layer_weights(shape, dtype, device, fused) for _ in range(shape.num_hidden_layers)]
              for fused in (False, True)}
    weight_bytes = sum(w.numel() * w.element_size() for ws in layers[False] for w in ws)
    results = []
    for m in (int(b) for b in a.batch_sizes.split(",")):
        x = torch.randn(m, shape.hidden_size, device=device, dtype=dtype)
        x_inter = torch.randn(m, shape.intermediate_size, device=device, dtype=dtype)
        ms = {fused: time_ms(step_fn(layers[fused], x, x_inter), device, a.repeats) for fused in (False, True)}
        rec = {"model": a.model, "dtype": a.dtype, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "batch": m, "separate_ms": ms[False], "fused_ms": ms[True], "weights_gb": weight_bytes / 1e9,
               "separate_gb_s": weight_bytes / ms[False] / 1e6, "fused_gb_s": weight_bytes / ms[True] / 1e6}
        print(json.dumps(rec), flush=True)
        results.append(rec)
    return results


if __name__ == "__main__":
    main()
