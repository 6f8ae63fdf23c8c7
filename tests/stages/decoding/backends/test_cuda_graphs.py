"""Captured CUDA graphs of the decode step (stages/decoding/backends/cuda_graphs.py).

They need a GPU: skipped here and in CI, run on the device machine by the GPU kit
(``make gpu-night`` step ``graphs``, infra/README.md). On CPU they are refused, naming the
device (the first test; and the ``cudagraphs`` choice in tests/stages/decoding/backends/test_contract.py);
the buffers they write their results into are plain tensors, tested here on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_causal_lm

from stages.decoding.backends.cuda_graphs import CapturedSteps, SharedOutputs
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.forward import decode_view
from stages.decoding.request import Request
from stages.decoding.slot_step import SlotStep
from stages.decoding.slots import SlotCache
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (the GPU kit runs this)")
VOCAB = 2048


def test_graphs_are_refused_off_a_gpu(tiny_model):
    cache = SlotCache.for_model(tiny_model, slots=1, capacity=64)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, not cpu"):
        CapturedSteps(lambda x: x, cache)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, not cpu"):
        SlotStep(decode_view(tiny_model), cache, compile=True, backend="cudagraphs", capture=CapturedSteps)


@pytest.fixture(scope="module")
def model():
    return tiny_causal_lm(VOCAB, "llama", 0).cuda().eval()


def _loaded_cache(model, prompts):
    cache = SlotCache.for_model(model, slots=len(prompts), capacity=256)
    state = prefill_full(model, prompts, 0)
    for row in range(len(prompts)):
        cache.load(row, state, row)
    return cache


@needs_cuda
def test_a_replayed_step_equals_the_eager_step_bit_for_bit(model):
    # The graph replays the eager step's own kernels: logits and cache writes are identical.
    prompts = [list(range(5, 40)), list(range(100, 112)), list(range(300, 321))]
    feed = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]], device="cuda")
    n_fed = torch.tensor([4, 2, 1], device="cuda")
    got = {}
    for how in ("eager", "graphs"):
        cache = _loaded_cache(model, prompts)
        step = SlotStep(decode_view(model), cache, compile=how == "graphs", backend="cudagraphs", capture=CapturedSteps if how == "graphs" else None, min_span=64)
        runs = [step.greedy(feed, n_fed, 64) for _ in range(3)]  # capture, then two replays
        got[how] = (step.step(feed, 64), runs, cache.layers[0].keys.clone())
        if how == "graphs":
            assert step._greedy.captures == 1 and step._logits.captures == 1
    assert torch.equal(got["eager"][0], got["graphs"][0])
    for (b1, a1), (b2, a2) in zip(got["eager"][1], got["graphs"][1], strict=True):
        assert torch.equal(b1, b2) and torch.equal(a1, a2)
    assert torch.equal(got["eager"][2], got["graphs"][2])


@needs_cuda
def test_the_engine_captures_at_warm_up_and_never_while_decoding(model):
    cfg = DecodeConfig(max_new_tokens=40, eos_ids=frozenset({-1}), speculative="prompt_lookup",
                       num_draft_tokens=4, adaptive=False)
    prompts = [list(range(5, 5 + n)) for n in (12, 70, 33, 50, 9, 61)]
    reqs = [Request(i, PromptParts([], p, []), p * 2, seed=i) for i, p in enumerate(prompts)]
    eng = Engine(model, cfg, slots=4, expected_tokens=120, compile="cudagraphs", min_span=64)
    eng.warm_up(greedy=True)
    warm = eng.step_fn._greedy.captures
    assert warm > 1
    out = eng.run(reqs)
    assert all(o.error is None and len(o.result.tokens) == 40 for o in out)
    assert eng.step_fn._greedy.captures == warm and eng.stats.relayouts == 0


@needs_cuda
def test_a_relayout_drops_the_graphs_that_hold_old_addresses(model):
    cache = _loaded_cache(model, [list(range(5, 40))])
    step = SlotStep(decode_view(model), cache, compile=True, backend="cudagraphs", capture=CapturedSteps, min_span=64)
    feed = torch.tensor([[7]], device="cuda")
    step.step(feed, 64)
    assert isinstance(step._logits, CapturedSteps) and len(step._logits.graphs) == 1
    cache.grow(512)  # new tensors: a replay of the old graph would read freed memory
    eager = SlotStep(decode_view(model), cache, min_span=64).step(feed, 64)
    assert torch.equal(step.step(feed, 64), eager) and step._logits.captures == 2
    assert len(step._logits.graphs) == 1


@needs_cuda
def test_an_engine_that_lays_its_slots_out_again_keeps_decoding_with_graphs(model):
    # The first H200 night failed here: rows longer than the warm-up's layout made the
    # engine re-lay out its slots, the graphs were dropped, and the next capture reused
    # their pool ("use_count > 0" allocator assertion), failing every row.
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=frozenset({-1}), speculative="none")
    prompts = [list(range(5, 5 + n)) for n in (20, 30, 200, 240)]
    reqs = [Request(i, PromptParts([], p, []), p, seed=i) for i, p in enumerate(prompts)]
    eng = Engine(model, cfg, slots=2, expected_tokens=40, compile="cudagraphs", min_span=32)
    eng.warm_up(greedy=True)
    out = eng.run(reqs)
    # (Token equality with the eager engine is not asked: eager steps take exact shapes,
    # graphs bucketed ones, and fp32 GPU kernels differ by shape; the replay itself is
    # bit-exact, test_a_replayed_step_equals_the_eager_step_bit_for_bit.)
    assert eng.stats.relayouts >= 1 and all(o.error is None and len(o.result.tokens) == 16 for o in out)


def test_shared_outputs_give_each_shape_a_view_at_the_start_of_one_buffer():
    shared = SharedOutputs()
    small = shared.view(0, torch.zeros(2, 3, 5))
    assert small.shape == (2, 3, 5) and small.data_ptr() == shared.buffers[0].data_ptr()
    same = shared.view(0, torch.zeros(2, 1, 5))  # fits: the same buffer
    assert same.data_ptr() == small.data_ptr() and shared.buffers[0].shape == (2, 3, 5)
    small.fill_(1.0)  # an earlier graph's view keeps its buffer when a larger shape comes
    wide = shared.view(0, torch.zeros(4, 2, 5))
    assert shared.buffers[0].shape == (4, 3, 5) and wide.shape == (4, 2, 5)
    assert wide.data_ptr() != small.data_ptr() and bool((small == 1.0).all())
    other = shared.view(1, torch.zeros(4, dtype=torch.long))  # each result position its own buffer
    assert other.dtype == torch.long and len(shared.buffers) == 2
    assert shared.view(1, torch.zeros(4)).dtype == torch.float32  # another dtype: a new buffer


@needs_cuda
def test_graphs_of_many_shapes_keep_one_results_buffer_not_one_each(model):
    # A sampling step's result is the logits [b, T, V]: one per graph would add up over every
    # (batch, width, span) the engine warms up. Here V is large, so the results dominate.
    cache = SlotCache.for_model(model, slots=1, capacity=64)  # on the GPU: only its layout is read
    vocab = 1 << 20
    weight = torch.randn(8, vocab, device="cuda")

    def step(x: torch.Tensor, span: torch.Tensor) -> torch.Tensor:  # x [b, T, 8], span [L] -> [b, T, V]
        return (x @ weight) * span.float().mean()

    graphs = CapturedSteps(step, cache)
    shapes = [(b, t, span) for b in (1, 2, 4) for t in (1, 2) for span in (16, 32, 64)]
    before = None
    for b, t, span in shapes:
        x = torch.randn(b, t, 8, device="cuda")
        spans = torch.arange(span, device="cuda")
        first = graphs(x, spans)  # capture
        assert torch.equal(graphs(x, spans), first) and torch.equal(first, step(x, spans))  # replay == eager
        del first
        if before is None:  # after the first shape: cuBLAS workspaces of every stream used are made
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
    del x, spans
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    largest = 4 * 2 * vocab * 4  # bytes of the [4, 2, V] float32 result
    assert graphs.captures == len(shapes)
    # Every graph's results are views of the shared buffers: 4 storages (the buffer as it grew:
    # [1, 1, V], [1, 2, V], [2, 2, V], [4, 2, V]) for 18 graphs, not one each.
    storages = {o.untyped_storage().data_ptr() for g in graphs.graphs.values() for o in g.outputs}
    assert len(storages) == 4
    # The buffer grew as the shapes came (2 + 4 + 8 units of V after the first shape's 1: ~1.75 x
    # largest), where a result kept per graph would hold 62 more units (~7.8 x largest).
    assert grown <= 2.5 * largest


@needs_cuda
def test_the_engine_warms_up_largest_first_so_each_results_buffer_is_allocated_once(model):
    cfg = DecodeConfig(max_new_tokens=8, eos_ids=frozenset({-1}), speculative="prompt_lookup", num_draft_tokens=8)
    eng = Engine(model, cfg, slots=8, expected_tokens=120, compile="cudagraphs", min_span=64)
    eng.warm_up(greedy=True)
    graphs = eng.step_fn._greedy
    assert graphs.captures == len(graphs.graphs) > 1  # one call per shape: captured on its first
    # (best [b, T], accepted [b]): one storage per result position across every graph.
    for position in range(2):
        storages = {g.outputs[position].untyped_storage().data_ptr() for g in graphs.graphs.values()}
        assert len(storages) == 1
