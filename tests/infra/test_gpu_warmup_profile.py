"""infra/gpu/warmup_profile.py dry on the CPU with a tiny model: the warm-up's shapes, timed."""

from __future__ import annotations

from gpu_scripts import gpu_script

from stages.decoding.slot_step import batch_buckets, warm_up_shapes, width_buckets


def test_warm_up_profile_on_cpu(capsys):
    warmup_profile = gpu_script("warmup_profile")
    report = warmup_profile.main(["--model", "random:tiny", "--slots", "4", "--capacity", "300", "--device", "cpu",
                                  "--num-draft-tokens", "8"])
    greedy, pld = report["runs"]
    assert (greedy["speculative"], pld["speculative"]) == ("none", "prompt_lookup")
    # The shapes the engine warms up: every batch bucket x width bucket x span (span >= width).
    spans = greedy["spans"]
    assert spans == pld["spans"] and spans[0] == 256  # the engine's own capacity, in span buckets
    assert greedy["shapes"] == len(warm_up_shapes(batch_buckets(4), (1,), spans)) == 2 * len(spans)
    assert pld["shapes"] == len(warm_up_shapes(batch_buckets(4), width_buckets(8), spans)) == 2 * 3 * len(spans)
    assert set(pld["by_width"]) == set(width_buckets(8)) == {1, 4, 9}
    assert pld["first_call_s"] > 0 and pld["later_calls_s"] == 0.0  # one call per shape off a GPU
    assert pld["empty_cache_calls"] == 0  # no capture on a CPU
    planned = set(warm_up_shapes(batch_buckets(4), width_buckets(8), spans))
    assert len(pld["slowest"]) == 8 and all(tuple(row[:3]) in planned for row in pld["slowest"])
    seconds = [row[3] for row in pld["slowest"]]
    assert seconds == sorted(seconds, reverse=True)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"none: {greedy['shapes']} shapes, warm-up")
    assert out[1].startswith(f"prompt_lookup: {pld['shapes']} shapes")
