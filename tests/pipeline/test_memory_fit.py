"""pipeline/memory_fit.py: a model or KV budget this machine's memory cannot hold is refused
before anything loads."""

from __future__ import annotations

from pipeline.memory_fit import memory_problems
from schemas.loading import spec_from_dict


def test_a_model_or_kv_budget_this_machines_memory_cannot_hold_is_refused():
    """random:llama-8b in float32 on 24 GiB climbed to 20 GB in 69 s before anything was said."""
    def spec(**generation_and_resources):
        gen = {k: v for k, v in generation_and_resources.items() if k in ("dtype",)}
        res = {k: v for k, v in generation_and_resources.items() if k not in ("dtype",)}
        return spec_from_dict({"name": "m", "input": {"uri": "/in"}, "generation": {"model": "random:llama-8b", **gen},
                               "resources": res})

    gib = 2**30
    (line,) = memory_problems(spec(dtype="float32"), available=24 * gib)
    assert line.startswith("generation.model: ~29.9 GiB of 'random:llama-8b' weights in float32")
    assert "fix: generation.dtype bfloat16 (~15.0 GiB a copy)" in line
    assert memory_problems(spec(dtype="bfloat16"), available=24 * gib) == []
    (kv,) = memory_problems(spec(dtype="bfloat16", kv_memory_gb=500), available=24 * gib)
    assert kv.startswith("resources.kv_memory_gb:") and "fix: a smaller resources.kv_memory_gb" in kv
    (two,) = memory_problems(spec(dtype="bfloat16", actors=2), available=24 * gib)
    assert "for 2 generate actor(s)" in two and "fewer resources.actors" in two
    assert memory_problems(spec(dtype="float32", num_gpus=1), available=24 * gib) == []  # the GPU holds it
