"""Whether a CPU run's model weights and KV budget fit this machine's memory, before
anything loads (`validate` and `run`, through pipeline/preflight.py).

Contract:
- ``memory_problems(spec, available=None)``: one line naming the field and the fixes when
  the generating model's weights at their dtype (one copy per generate actor) plus an
  explicit ``resources.kv_memory_gb`` per actor exceed the memory available
  (MemAvailable); nothing for a GPU run, or where the model's size or the memory is
  unknown.
- ``kv_budget_problems(spec)``: one line when an explicit ``resources.kv_memory_gb`` cannot
  hold a single row (the method's expected KV tokens and ``generation.max_new_tokens``, at
  the smallest width the dtype may take), on any device: the engine would refuse it only
  after the model loaded, every row retryable. A lower bound of the engine's own slot
  sizing (stages/decoding/engine.py ``_need``, which adds the draft width, rounds up to a
  slot step and leaves the prefix cache its share), so a refusal is always right.
"""

from __future__ import annotations

from schemas.spec import JobSpec


def memory_problems(spec: JobSpec, available: int | None = None) -> list[str]:
    """A CPU run whose generating model's weights (at its dtype, one copy per generate actor)
    and explicit KV budget exceed this machine's available memory (``available`` bytes;
    default: MemAvailable of /proc/meminfo): an 8B model in float32 on 24 GiB climbed to
    20 GB in 69 s before anything said a word. Weights are a floor of what a run holds, so
    only a job that surely cannot fit is refused. Nothing is said where the size or the
    memory is unknown."""
    from stages.context_budget import model_parameters

    res, gen = spec.resources, spec.generation
    if res.num_gpus > 0:
        return []  # the model sits in the GPU's memory: placement's check, not this one
    available = available if available is not None else _available_memory()
    params = model_parameters(gen.model)
    if available is None or params is None:
        return []
    actors = res.max_actors
    width = 2 if gen.dtype in ("bfloat16", "float16") else 4  # auto is float32 on a CPU
    weights = params * width * actors
    kv = int((res.kv_memory_gb or 0) * 2**30) * actors
    if weights + kv <= available:
        return []
    gib = 2**30
    held = f"~{weights / gib:.1f} GiB of {gen.model!r} weights in {'float32' if width == 4 else gen.dtype}"
    held += f" for {actors} generate actor(s)" if actors > 1 else ""
    if kv:
        held += f" + resources.kv_memory_gb {res.kv_memory_gb:g} per actor"
    fixes = [f"generation.dtype bfloat16 (~{params * 2 / gib:.1f} GiB a copy)"] if width == 4 else []
    fixes += ["fewer resources.actors"] if actors > 1 else []
    fixes += ["a smaller resources.kv_memory_gb"] if kv else []
    field = "resources.kv_memory_gb" if kv > available else "generation.model"
    return [f"{field}: {held}, more than the {available / gib:.1f} GiB this machine has available; "
            f"fix: {', '.join(fixes + ['a machine with more memory'])}"]


def kv_budget_problems(spec: JobSpec) -> list[str]:
    """An explicit KV budget too small for one row (see the module contract): a fixed
    ``resources.decode_slots`` count sizes its slots by need instead, so it is not checked."""
    from stages.compression import method_for
    from stages.context_budget import model_kv_bytes, model_parameters
    from stages.model_size import SMALL_MODEL_PARAMS

    res, gen = spec.resources, spec.generation
    if res.kv_memory_gb is None or res.decode_slots != "auto":
        return []
    # The dtype "auto" resolves to (stages/model_loading.py resolve_dtype): float32 on a
    # CPU, and on a GPU for a model known to be small; else bfloat16 (2 bytes, the floor).
    params = model_parameters(gen.model)
    small = params is not None and params < SMALL_MODEL_PARAMS
    width = 4 if gen.dtype == "float32" or (gen.dtype == "auto" and (res.num_gpus == 0 or small)) else 2
    per_token = model_kv_bytes(gen.model, width)
    if per_token is None:
        return []
    expected = method_for(spec.compression).expected_kv_tokens(spec)
    need = expected + gen.max_new_tokens + 1
    held = int(res.kv_memory_gb * 2**30) // per_token
    if held >= need:
        return []
    # Room for one row with the engine's slot step and the prefix cache's share: a floor.
    floor_gb = (need + 512) * per_token * 1.25 / 2**30
    return [f"resources.kv_memory_gb: {res.kv_memory_gb:g} GiB holds {held} KV tokens of {gen.model!r} "
            f"({per_token / 1024:.0f} KiB a token), and one row needs at least {need} ({expected} of prompt "
            f"for compression.method {spec.compression.method} + generation.max_new_tokens {gen.max_new_tokens}); "
            f"fix: leave resources.kv_memory_gb out (the engine takes a share of the memory free), or at least "
            f"{max(floor_gb, 0.01):.2f} for one row at a time"]


def _available_memory() -> int | None:
    """Bytes the kernel says new allocations can take (Linux MemAvailable), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
