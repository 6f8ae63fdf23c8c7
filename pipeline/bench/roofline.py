"""The memory roofline of decoding: bytes a step must read / memory bandwidth.

Contract:
- ``measure_bandwidth(device)`` -> bytes/s of a large copy on ``device``, counting
  bytes read plus bytes written (the convention of STREAM's copy and of the device
  notes). CUDA: a device-to-device copy of 1 GiB timed with CUDA events (best of 5
  after a warm-up). CPU: a 256 MiB ``copy_`` at the current torch thread count (the
  bench runs one thread on CPU, so this is what one core can stream).
- ``nominal_bandwidth(name)`` -> the data-sheet bandwidth (bytes/s) for a known GPU
  name, else None. The roofline uses the measured figure; the nominal one is printed
  beside it.
- ``step_bytes(model, batch, context)`` -> (weight bytes, KV bytes) one decode step
  reads: every parameter once except an untied input embedding (a step gathers B
  rows of it, not the table), plus K and V of ``context`` cached tokens per row.
- ``roofline_tok_s(...)`` -> tokens/s if a step took exactly its bytes / bandwidth.
"""

from __future__ import annotations

import time

import torch

# Data-sheet HBM bandwidth, GB/s (10^9 bytes), by a substring of torch's device name.
# Order matters: the first match wins, so the specific names come first.
NOMINAL_GBPS: tuple[tuple[str, float], ...] = (
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM (HBM3)
    ("GH200", 4000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("T4", 320.0),
)


def device_name(device: torch.device) -> str:
    """Human name of the device: the GPU's name, or the CPU model from /proc/cpuinfo."""
    from stages.decoding.backends import device_backend

    own = device_backend(device).hardware_name(device)
    if own is not None:
        return own
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def nominal_bandwidth(name: str) -> float | None:
    """Data-sheet bandwidth in bytes/s for a GPU name, None when unknown (or a CPU)."""
    for key, gbps in NOMINAL_GBPS:
        if key.lower() in name.lower():
            return gbps * 1e9
    return None


def measure_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write) on ``device``; see the module docstring."""
    if device.type == "cuda":
        n = (nbytes or 2**30) // 4
        src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        del src, dst
        torch.cuda.empty_cache()
        return 2 * n * 4 / best
    n = (nbytes or 2**28) // 4
    src = torch.rand(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best


def kv_bytes_per_token(model) -> int:
    """Bytes of K and V one cached token holds across all layers."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elem = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads (see the module docstring)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb  # tied weights share one Parameter
    return total if tied else total - emb.numel() * emb.element_size()


def step_bytes(model, batch: int, context: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) read by one decode step of ``batch`` rows over ``context`` tokens."""
    return weight_bytes_per_step(model), batch * context * kv_bytes_per_token(model)


def roofline_tok_s(batch: int, weight_bytes: int, kv_bytes: int, bandwidth: float) -> float:
    """Tokens/s of ``batch`` rows if every step cost exactly its bytes / bandwidth."""
    return batch * bandwidth / (weight_bytes + kv_bytes)
