"""pipeline/memory_fit.py: a model or KV budget this machine's memory cannot hold is refused
before anything loads."""

from __future__ import annotations

from pipeline.memory_fit import kv_budget_problems, memory_problems
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


def test_a_kv_budget_that_holds_no_row_is_refused_and_the_floor_named_holds_one():
    """kv_memory_gb: 0.01 on the embedded model was accepted and every row failed after the
    model loaded; the refusal is a lower bound of the engine's own slot sizing."""
    import re

    from stages.decoding.engine import PREFIX_CACHE_SHARE
    from stages.decoding.memory import KvBudget

    def spec(kv_gb, **parts):
        return spec_from_dict({"name": "k", "input": {"uri": "/in"}, "resources": {"kv_memory_gb": kv_gb},
                               **parts})

    (line,) = kv_budget_problems(spec(0.01))
    assert line.startswith("resources.kv_memory_gb: 0.01 GiB holds 233 KV tokens of 'embedded:smollm2-135m-instruct'")
    assert "one row needs at least 2177 (2048 of prompt for compression.method none" in line
    floor = float(re.search(r"or at least ([0-9.]+) for one row", line).group(1))
    per_token = 30 * 3 * 64 * 2 * 4
    # The engine's need: expected + max_new + the widest step (17 with the default 16 drafts) + 1, in slots of
    # 256 tokens, after the prefix cache's share.
    engine_need = 2048 + 128 + 17 + 1
    assert KvBudget(per_token, int(0.01 * 2**30)).layout(engine_need) is None
    assert KvBudget(per_token, int(floor * 2**30 * (1 - PREFIX_CACHE_SHARE))).layout(engine_need) is not None
    assert kv_budget_problems(spec(floor)) == []
    # A budgeted method needs its budget, not the default 2,048; fixed slots are sized by need.
    (small,) = kv_budget_problems(spec(0.01, compression={"method": "truncate", "target_tokens": 512}))
    assert "at least 833 (704 of prompt for compression.method truncate" in small
    assert kv_budget_problems(spec(0.01, resources={"kv_memory_gb": 0.01, "decode_slots": 4})) == []
    assert kv_budget_problems(spec(None)) == []
    # On a GPU "auto" keeps float32 for a small model (the embedded one): 4 bytes, not 2.
    (gpu,) = kv_budget_problems(spec(0.01, resources={"kv_memory_gb": 0.01, "num_gpus": 1}))
    assert "holds 233 KV tokens" in gpu and "(45 KiB a token)" in gpu
    (big,) = kv_budget_problems(spec_from_dict({"name": "k", "input": {"uri": "/in"}, "generation": {
        "model": "random:llama-8b"}, "resources": {"kv_memory_gb": 0.01, "num_gpus": 1}}))
    assert "(128 KiB a token)" in big  # bfloat16 for a large one
