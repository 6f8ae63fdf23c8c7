"""The static step: buckets, compilation that holds (no recompiles after warm-up), and a
compiled (inductor) step that decodes exactly like the eager one in fp32."""

from __future__ import annotations

import pytest
import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.slot_engine import SlotEngine, compile_plan
from stages.decoding.slot_step import batch_buckets, bucket, span_buckets, width_buckets
from stages.decoding.state import prefill_full


def test_buckets():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(2) == (2,)
    assert batch_buckets(8) == (2, 4, 8)
    assert batch_buckets(6) == (2, 4, 6)
    assert width_buckets(0) == (1,)
    assert width_buckets(16) == (1, 4, 8, 17)
    assert width_buckets(8) == (1, 4, 9) and width_buckets(1) == (1, 2)
    assert width_buckets(7) == (1, 4, 8)
    assert span_buckets(1170) == (256, 512, 1024, 1170) and span_buckets(256) == (256,)
    assert span_buckets(100) == (100,) and span_buckets(64, smallest=16) == (16, 32, 64)
    assert bucket(3, (1, 2, 4, 8)) == 4 and bucket(8, (1, 2, 4, 8)) == 8
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        bucket(9, (1, 2, 4, 8))


class CompileCounter:
    """A torch.compile backend that counts graphs dynamo hands it (and runs them eagerly)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize("greedy", [True, False])
def test_no_recompilation_after_warm_up(tiny_model, greedy):
    """100+ steps with varying row lengths, drafts, finishing rows and refills: the warm-up's
    graphs are all the step ever needs (the property CUDA graph replay relies on)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    eng = SlotEngine(tiny_model, slots=4, max_drafts=8, capacity=256, compile=True, compile_backend=counter,
                     min_span=32)
    eng.warm_up(greedy=greedy)
    warm = counter.graphs
    # Batch, width and span are symbolic: one graph per width class (1; >= 4), not one per
    # (batch, width, span) bucket.
    assert len(eng.batches) * len(eng.widths) == 6 and eng.step.spans == (32, 64, 128, 256) and warm == 2
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 2000, (int(n),), generator=g).tolist() for n in torch.randint(2, 60, (16,), generator=g)]
    # Lookups repeat each prompt so drafts of many lengths get proposed and rejected.
    lookups = [p * 3 for p in prompts]
    cfg = DecodeConfig(
        max_new_tokens=60, eos_ids=frozenset({-1}), temperature=0.0 if greedy else 0.8,
        speculative="prompt_lookup", num_draft_tokens=8, adaptive=False, min_ngram=1, max_ngram=2,
    )
    out, errors = eng.run(lookups, list(range(16)), lambda idx: prefill_full(tiny_model, [prompts[i] for i in idx], 0), cfg)
    assert errors == [None] * 16 and all(len(r.tokens) == 60 for r in out)
    assert eng.stats.steps >= 100 and eng.stats.refills > 1 and eng.stats.grows == 0
    assert counter.graphs == warm, f"{counter.graphs - warm} recompilations after warm-up"
    torch._dynamo.reset()


def test_concrete_shapes_compile_once_each_and_never_again(tiny_model):
    """symbolic=False (the cudagraphs backend's setting): the warm-up compiles each
    (batch, width, span) shape once, and decoding after it compiles nothing."""
    torch._dynamo.reset()
    counter = CompileCounter()
    eng = SlotEngine(tiny_model, slots=2, max_drafts=3, capacity=128, compile=True, compile_backend=counter,
                     min_span=64)
    eng.step.symbolic = False
    eng.warm_up(greedy=True)
    shapes = len(eng.batches) * len(eng.widths) * len(eng.step.spans)
    assert (eng.batches, eng.widths, eng.step.spans) == ((2,), (1, 4), (64, 128)) and counter.graphs == shapes
    prompts = [list(range(5, 30)), list(range(100, 160)), list(range(7, 12))]
    cfg = DecodeConfig(max_new_tokens=30, eos_ids=frozenset({-1}), speculative="prompt_lookup",
                       num_draft_tokens=3, adaptive=False)
    out, errors = eng.run([p * 2 for p in prompts], [0] * 3,
                          lambda idx: prefill_full(tiny_model, [prompts[i] for i in idx], 0), cfg)
    assert errors == [None] * 3 and counter.graphs == shapes
    torch._dynamo.reset()


def test_a_step_over_a_span_equals_the_step_over_the_whole_capacity(tiny_model):
    """Attending over the first L slots gives the logits (and cache writes) of attending
    over all S: slots past every row's length + T are masked anyway."""
    prompts = [list(range(5, 30)), list(range(100, 109))]
    logits, keys = [], []
    for span in (None, 32):
        eng = SlotEngine(tiny_model, slots=2, max_drafts=3, capacity=200, min_span=32)
        state = prefill_full(tiny_model, prompts, 0)
        for row in range(2):
            eng.cache.load(row, state, row)
        feed = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]])
        logits.append(eng.step.step(feed, span))
        keys.append(eng.cache.layers[0].keys.clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(keys[0], keys[1])
    with pytest.raises(ValueError, match="span 300 outside 1..200"):
        eng.step.step(feed, 300)


def test_inductor_compiled_step_decodes_like_eager(tiny_model):
    """One real inductor graph (batch 1, width 1; ~15 s of compilation on this CPU)."""
    torch._dynamo.reset()
    prompts = [list(range(5, 30)), list(range(100, 109))]
    cfg = DecodeConfig(max_new_tokens=10, eos_ids=frozenset({-1}))
    ref = decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)
    eng = SlotEngine(tiny_model, slots=1, max_drafts=0, capacity=64, compile=True)
    assert eng.step.compiled and "compiled" in eng.describe()
    eng.warm_up(greedy=True)
    out, _ = eng.run(prompts, [0, 0], lambda idx: prefill_full(tiny_model, [prompts[i] for i in idx], 0), cfg)
    assert [r.tokens for r in out] == [r.tokens for r in ref]
    torch._dynamo.reset()


def test_compile_choices_by_device(tiny_model):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compile_plan("auto", cpu) == (None, None) and compile_plan(None, cpu) == (None, None)
    assert compile_plan("auto", cuda) == ("reduce-overhead", "inductor")
    assert compile_plan(True, cpu) == (None, "inductor")
    assert compile_plan("cudagraphs", cuda) == (None, "cudagraphs")
    assert SlotEngine(tiny_model, slots=2, compile="off").step.symbolic  # only cudagraphs turns it off
    assert compile_plan("off", cuda) == (None, None)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        compile_plan("cudagraphs", cpu)
    with pytest.raises(ValueError, match="allowed: auto, inductor, cudagraphs, off"):
        compile_plan("fast", cpu)
