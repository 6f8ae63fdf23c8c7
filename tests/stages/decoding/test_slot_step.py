"""The step over KV slots: buckets, compilation that holds (no recompiles after warm-up,
across refills, buckets and admissions), a span equal to the whole capacity, a prefill
chunk equal to a full forward, and a compiled (inductor) step decoding like eager."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.forward import decode_view
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.slot_step import (
    SlotStep,
    batch_buckets,
    bucket,
    span_buckets,
    warm_up_shapes,
    width_buckets,
)
from stages.decoding.slots import SlotCache
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts


def test_buckets():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(2) == (2,)
    assert batch_buckets(8) == (2, 4, 8)
    assert batch_buckets(6) == (2, 4, 6)
    assert batch_buckets(256)[-1] == 256 and len(batch_buckets(256)) == 8
    assert width_buckets(0) == (1,)
    assert width_buckets(16) == (1, 4, 8, 17)
    assert width_buckets(8) == (1, 4, 9) and width_buckets(1) == (1, 2)
    assert width_buckets(7) == (1, 4, 8)
    assert span_buckets(1170) == (256, 512, 1024, 1170) and span_buckets(256) == (256,)
    assert span_buckets(100) == (100,) and span_buckets(64, smallest=16) == (16, 32, 64)
    assert bucket(3, (1, 2, 4, 8)) == 4 and bucket(8, (1, 2, 4, 8)) == 8
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        bucket(9, (1, 2, 4, 8))


def test_warm_up_shapes_are_every_step_shape_largest_first():
    shapes = warm_up_shapes((2, 4), (1, 4, 8), (4, 8, 16))
    # Every (batch, width, span) with the span covering the width, once each.
    assert sorted(shapes) == sorted((b, t, s) for b in (2, 4) for t in (1, 4, 8) for s in (4, 8, 16) if s >= t)
    assert len(shapes) == len(set(shapes)) == 16
    # Most tokens fed first, then the longest span: the first shape has the largest batch,
    # width and span at once, so captured graphs' shared result buffers are allocated once,
    # at their final size (stages/decoding/backends/cuda_graphs.py).
    assert shapes[:2] == [(4, 8, 16), (4, 8, 8)] and shapes[-1] == (2, 1, 4)
    tokens = [b * t for b, t, _ in shapes]
    assert tokens == sorted(tokens, reverse=True)


def test_a_step_is_ready_after_one_warm_up_call_unless_graph_trees_record_later(tiny_model):
    cache = SlotCache.for_model(tiny_model, slots=2, capacity=64)
    assert SlotStep(decode_view(tiny_model), cache).warm_up_calls() == 1  # eager
    compiled_on_cpu = SlotStep(decode_view(tiny_model), cache, compile=True, backend=CompileCounter())
    assert compiled_on_cpu.warm_up_calls() == 1  # no CUDA graph trees off a GPU


class CompileCounter:
    """A torch.compile backend that counts graphs dynamo hands it (and runs them eagerly)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _requests(prompts, lookups):
    return [Request(i, PromptParts([], p, []), lk, seed=i) for i, (p, lk) in enumerate(zip(prompts, lookups, strict=True))]


@pytest.mark.parametrize("greedy", [True, False])
def test_no_recompilation_after_warm_up(tiny_model, greedy):
    """100+ steps with varying row lengths, drafts, finishing rows and admissions of newcomers:
    the warm-up's graphs are all the step ever needs (the property CUDA graph replay relies on)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    cfg = DecodeConfig(
        max_new_tokens=60, eos_ids=frozenset({-1}), temperature=0.0 if greedy else 0.8,
        speculative="prompt_lookup", num_draft_tokens=8, adaptive=False, min_ngram=1, max_ngram=2,
    )
    eng = Engine(tiny_model, cfg, slots=4, expected_tokens=120, compile=True, compile_backend=counter, min_span=32)
    eng.warm_up(greedy=greedy)
    warm = counter.graphs
    # Batch, width and span are symbolic: one graph per width class (1; >= 4), not one per
    # (batch, width, span) bucket.
    assert eng.cache.capacity == 256 and span_buckets(256, 32) == (32, 64, 128, 256) and warm == 2
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 2000, (int(n),), generator=g).tolist() for n in torch.randint(2, 60, (16,), generator=g)]
    # Lookups repeat each prompt so drafts of many lengths get proposed and rejected.
    out = eng.run(_requests(prompts, [p * 3 for p in prompts]))
    assert all(o.error is None and len(o.result.tokens) == 60 for o in out)
    assert eng.stats.steps >= 100 and eng.stats.relayouts == 0
    assert counter.graphs == warm, f"{counter.graphs - warm} recompilations after warm-up"
    torch._dynamo.reset()


def test_a_step_over_a_span_equals_the_step_over_the_whole_capacity(tiny_model):
    """Attending over the first L slots gives the logits (and cache writes) of attending
    over all S: slots past every row's length + T are masked anyway."""
    prompts = [list(range(5, 30)), list(range(100, 109))]
    logits, keys = [], []
    for span in (None, 32):
        cache = SlotCache.for_model(tiny_model, slots=2, capacity=200)
        step = SlotStep(decode_view(tiny_model), cache, min_span=32)
        state = prefill_full(tiny_model, prompts, 0)
        for row in range(2):
            cache.load(row, state, row)
        feed = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]])
        logits.append(step.step(feed, span))
        keys.append(cache.layers[0].keys.clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(keys[0], keys[1])
    with pytest.raises(ValueError, match="span 300 outside 1..200"):
        step.step(feed, 300)


@pytest.mark.parametrize("chunks", [[25], [10, 10, 5], [1, 24]])
def test_prefill_chunks_into_a_slot_equal_a_full_forward(tiny_model, chunks):
    """The engine's own prefill: a prompt written into its slot chunk by chunk (the first
    chunk on the causal kernel, later ones with the causal mask over earlier chunks) gives
    the full forward's last logits and keys."""
    prompt = torch.arange(5, 30)
    with torch.inference_mode():
        ref = tiny_model(prompt[None]).logits[0, -1]
    state = prefill_full(tiny_model, [prompt.tolist()], 0)
    cache = SlotCache.for_model(tiny_model, slots=3, capacity=64)
    step = SlotStep(decode_view(tiny_model), cache)
    writer = cache.row_writer(2)
    done = 0
    for n in chunks:
        last = step.prefill(writer, prompt[done : done + n], done)
        writer.commit(n, done + n)
        done += n
    torch.testing.assert_close(last, ref, rtol=1e-4, atol=1e-4)
    assert cache.length.tolist() == [0, 0, 25] and cache.pos.tolist() == [0, 0, 25]
    torch.testing.assert_close(cache.layers[1].keys[2, :, :25], state.cache.layers[1].keys[0], rtol=1e-5, atol=1e-5)


def test_inductor_compiled_step_decodes_like_eager(tiny_model):
    """One real inductor graph (batch 1, width 1; ~15 s of compilation on this CPU)."""
    torch._dynamo.reset()
    prompts = [list(range(5, 30)), list(range(100, 109))]
    cfg = DecodeConfig(max_new_tokens=10, eos_ids=frozenset({-1}))
    ref = decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)
    eng = Engine(tiny_model, cfg, slots=1, expected_tokens=30, compile=True)
    assert eng.backend.compiled and "compiled" in eng.describe()
    eng.warm_up(greedy=True)
    out = eng.run(_requests(prompts, prompts))
    assert [o.result.tokens for o in out] == [r.tokens for r in ref]
    torch._dynamo.reset()
