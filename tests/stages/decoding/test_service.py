"""The engine on its own thread, fed by several callers at once (a generate actor taking
several Ray batches): every caller gets its rows, in order, equal to plain greedy; the
callers' requests share the decode batch; an engine error reaches every waiter."""

from __future__ import annotations

import threading

import pytest
import torch

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.service import EngineService, EngineStopped
from stages.decoding.state import prefill_full
from stages.prompting import PromptParts

NO_EOS = frozenset({-1})


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(3, 2000, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (9,), generator=g)]


def test_concurrent_callers_share_one_engine(tiny_model, prompts):
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=NO_EOS, speculative="prompt_lookup")
    ref = [r.tokens for r in decode_plain(tiny_model, prefill_full(tiny_model, prompts, 0), cfg)]
    eng = Engine(tiny_model, cfg, slots=6, expected_tokens=16)
    service = EngineService(eng)
    batches = [list(range(0, 3)), list(range(3, 6)), list(range(6, 9))]  # three "Ray batches"
    results: dict[int, list] = {}
    start = threading.Barrier(len(batches))

    def call(b: int) -> None:
        start.wait()
        reqs = [Request(key=i, parts=PromptParts([], prompts[i], []), lookup_ids=prompts[i]) for i in batches[b]]
        results[b] = service.generate(reqs)

    threads = [threading.Thread(target=call, args=(b,)) for b in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    service.close(timeout=60)
    for b, idx in enumerate(batches):
        assert [f.key for f in results[b]] == idx  # the caller's own keys, in its order
        assert [f.result.tokens for f in results[b]] == [ref[i] for i in idx]
    assert eng.stats.max_active > 3  # rows of different callers decoded together


def test_an_engine_error_reaches_every_waiter_and_stops_the_service(tiny_model, prompts, monkeypatch):
    cfg = DecodeConfig(max_new_tokens=8, eos_ids=NO_EOS)
    eng = Engine(tiny_model, cfg, slots=2, expected_tokens=16)

    def broken_step():
        raise RuntimeError("engine bug")

    monkeypatch.setattr(eng, "step", broken_step)
    service = EngineService(eng)
    out = service.generate([Request(key="a", parts=PromptParts([], prompts[0], []), lookup_ids=prompts[0])])
    assert out[0].key == "a" and out[0].result is None and "engine bug" in str(out[0].error)
    with pytest.raises(EngineStopped, match="engine bug"):
        service.generate([Request(key="b", parts=PromptParts([], prompts[1], []), lookup_ids=prompts[1])])


def test_the_engine_thread_runs_with_the_creators_torch_thread_count(tiny_model, monkeypatch):
    """OpenMP starts a new thread at OMP_NUM_THREADS (Ray sets it for its workers), not at
    the count the actor chose: the service's thread sets its own before any forward."""
    calls: list[tuple[str, int]] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append((threading.current_thread().name, n)), real(n)))
    before = torch.get_num_threads()
    cfg = DecodeConfig(max_new_tokens=2, eos_ids=frozenset({-1}), speculative="none")
    service = EngineService(Engine(tiny_model, cfg, slots=1, expected_tokens=16), name="engine-under-test")
    try:
        service.generate([Request(0, PromptParts([], [5, 6, 7], []), [5, 6, 7])])
    finally:
        service.close()
    assert calls == [("engine-under-test", before)]


def test_a_service_given_a_builder_builds_and_steps_its_engine_on_its_own_thread(tiny_model, prompts, monkeypatch):
    """OpenMP teams on two threads slow every CPU forward pass (service.py): the builder's
    torch work (model load, warm-up) and every step run on the service's one thread."""
    where: list[tuple[str, int]] = []
    cfg = DecodeConfig(max_new_tokens=4, eos_ids=NO_EOS)

    def build() -> Engine:
        where.append(("build", threading.get_ident()))
        return Engine(tiny_model, cfg, slots=2, expected_tokens=48)

    service = EngineService(build)
    real_step = service.engine.step
    monkeypatch.setattr(service.engine, "step", lambda: (where.append(("step", threading.get_ident())), real_step())[1])
    try:
        out = service.generate([Request(key=0, parts=PromptParts([], prompts[0], []), lookup_ids=prompts[0])])
    finally:
        service.close(timeout=60)
    assert out[0].error is None and len(out[0].result.tokens) == 4
    assert {w for w, _ in where} == {"build", "step"}
    assert len({ident for _, ident in where}) == 1 and where[0][1] != threading.get_ident()


def test_a_builder_that_raises_fails_the_constructor_with_its_error():
    def build() -> Engine:
        raise ValueError("generate: the decode engine cannot run 'x' on cpu")

    threads_before = threading.active_count()
    with pytest.raises(ValueError, match="cannot run 'x'"):
        EngineService(build, name="engine-that-never-was")
    assert threading.active_count() == threads_before  # its thread has ended


def test_stop_ends_the_thread_after_its_step_and_waiters_hear_of_it(tiny_model, prompts):
    """An interrupt: rows in hand are abandoned, the thread is gone, later calls are refused."""
    cfg = DecodeConfig(max_new_tokens=10_000, eos_ids=NO_EOS)  # would decode for minutes
    eng = Engine(tiny_model, cfg, slots=2, expected_tokens=64)
    service = EngineService(eng)
    out: list = []
    caller = threading.Thread(target=lambda: out.extend(service.generate(
        [Request(key=0, parts=PromptParts([], prompts[0], []), lookup_ids=prompts[0])])))
    caller.start()
    while not eng.stats.steps:  # decoding has begun
        threading.Event().wait(0.01)
    service.stop(timeout=60)
    caller.join(timeout=60)
    assert not service._thread.is_alive() and not caller.is_alive()
    assert isinstance(out[0].error, EngineStopped) and "interrupted" in str(out[0].error)
    with pytest.raises(EngineStopped):
        service.generate([Request(key=1, parts=PromptParts([], prompts[1], []), lookup_ids=prompts[1])])
