"""The memory roofline of decoding: bytes a step must read / memory bandwidth.

Contract:
- ``measure_bandwidth(device)`` -> bytes/s of a large copy on ``device``, counting
  bytes read plus bytes written (the convention of STREAM's copy and of the device
  notes), best of 5 after a warm-up, as the device's step backend sizes and times it
  (stages/decoding/backends: ``bandwidth_probe_bytes``, ``time_device_work``). CUDA: a
  device-to-device copy of 1 GiB timed with CUDA events. CPU: a 256 MiB ``copy_`` at
  the current torch thread count (the bench runs one thread on CPU, so this is what one
  core can stream), timed with ``perf_counter``.
- ``nominal_bandwidth(device, name)`` -> the data-sheet bandwidth (bytes/s) of the
  device called ``name``, else None (the backend's ``nominal_bandwidth``: CUDA's table,
  none for a CPU). The roofline uses the measured figure; the nominal one is printed
  beside it.
- ``step_bytes(model, batch, context)`` -> (weight bytes, KV bytes) one decode step
  reads: every parameter once except an untied input embedding (a step gathers B
  rows of it, not the table), plus K and V of ``context`` cached tokens per row.
- ``roofline_tok_s(...)`` -> tokens/s if a step took exactly its bytes / bandwidth.
"""

from __future__ import annotations

import torch


def device_name(device: torch.device) -> str:
    """Human name of the device: the GPU's name, or the CPU model from /proc/cpuinfo."""
    from stages.decoding.backends import device_backend

    own = device_backend(device).hardware_name(device)
    if own is not None:
        return own
    import platform

    from pipeline.host_load import cpu_name

    return cpu_name() or platform.processor() or "cpu"


def nominal_bandwidth(device: torch.device, name: str) -> float | None:
    """Data-sheet bandwidth in bytes/s of ``device`` called ``name``; None when unknown (or a CPU)."""
    from stages.decoding.backends import device_backend

    return device_backend(device).nominal_bandwidth(name)


def measure_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write) on ``device``; see the module docstring."""
    from stages.decoding.backends import device_backend

    backend = device_backend(device)
    n = (nbytes or backend.bandwidth_probe_bytes) // 4
    best = _best_copy_seconds(backend, device, n, repeats)
    backend.empty_cache(device)  # the copy's buffers are freed: hand them back
    return 2 * n * 4 / best


def _best_copy_seconds(backend, device: torch.device, n: int, repeats: int) -> float:
    """The fastest of ``repeats`` copies of ``n`` float32 on ``device``, after a warm-up."""
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up (on the host: faults the pages in)
    return min(backend.time_device_work(device, lambda: dst.copy_(src)) for _ in range(repeats))


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
