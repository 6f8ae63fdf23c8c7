"""stages/decoding/backends/torch_eager.py: the CPU process settings (``prepare_process``);
transformers' SDPA path given grouped KV heads reads bitwise what it read with them copied out;
``host_attention`` reads a windowed layer's window only, with the same result."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import tiny_causal_lm

from stages.decoding.backends.torch_eager import (
    GROUPED_SDPA_ENV,
    TorchEagerBackend,
    grouped_heads_in_sdpa,
    host_attention,
)
from stages.decoding.forward import packed_gqa_sdpa
from stages.finch.config import FinchCompression
from stages.finch.prefill import finch_prefill
from stages.finch.spans import Boundaries
from stages.prompting import PromptParts


def test_a_cpu_process_lets_sdpa_take_grouped_heads_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(GROUPED_SDPA_ENV, raising=False)
    assert TorchEagerBackend.prepare_process(torch.device("meta"), 1) is None  # not a CPU: nothing set
    assert GROUPED_SDPA_ENV not in os.environ
    said = TorchEagerBackend.prepare_process(torch.device("cpu"), torch.get_num_threads())
    assert said is not None and "grouped KV heads" in said
    assert os.environ[GROUPED_SDPA_ENV] == "1"
    monkeypatch.setenv(GROUPED_SDPA_ENV, "0")  # the user's choice stands
    assert grouped_heads_in_sdpa() is None and os.environ[GROUPED_SDPA_ENV] == "0"


def test_a_cpu_process_takes_the_cpus_it_is_given_and_keeps_its_own_without():
    threads = torch.get_num_threads()
    try:
        TorchEagerBackend.prepare_process(torch.device("cpu"), 1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        TorchEagerBackend.prepare_process(torch.device("cpu"), None)  # num_cpus auto, outside a run
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cfg", [
    {"reading": "chunk", "scoring": "heads", "keep": "sentences", "min_relevance": 0.5},  # read once, three rows
    {"reading": "kept", "scoring": "paper"},  # the paper's reading
], ids=["chunk-heads", "kept-paper"])
def test_a_finch_reading_is_bitwise_the_same_with_grouped_heads(cfg, monkeypatch):
    """float32 on the CPU kernel, 4 query / 2 KV heads: every pass has a mask, so without the
    switch transformers copies the KV heads out; with it SDPA reads them grouped."""
    model = tiny_causal_lm(97, "llama", 5, torch.float32, pad_token_id=0)
    g = torch.Generator().manual_seed(1)
    doc = torch.randint(3, 97, (150,), generator=g).tolist()
    parts = [PromptParts([1, 5, 6], doc, torch.randint(3, 97, (n,), generator=g).tolist()) for n in (5, 9, 7)]
    config = FinchCompression(target_tokens=40, chunk_tokens=32, **cfg).resolved("qa")
    bounds = Boundaries(breaks=frozenset(), ends=frozenset(range(10, 20)), opens=frozenset())  # ids 10-19 end one
    from transformers.integrations import sdpa_attention

    copies, copy = [], sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or copy(x, n))
    outs, copied = {}, {}
    for switch in ("0", "1"):
        monkeypatch.setenv(GROUPED_SDPA_ENV, switch)
        copies.clear()
        outs[switch] = finch_prefill(model, parts, config, 0, boundaries=bounds if config.keep == "sentences" else None)
        copied[switch] = len(copies)
    assert copied["0"] > 0 and copied["1"] == 0  # the switch is what changed the path
    assert torch.equal(outs["0"].state.last_logits, outs["1"].state.last_logits)
    assert outs["0"].kept_positions == outs["1"].kept_positions
    assert outs["0"].context_tokens == outs["1"].context_tokens


def test_a_windowed_step_reads_only_the_window_and_attends_the_same(monkeypatch):
    """Rows at slots 30 and 37 (T = 2), window 8: slots before 23 are never seen, so they are
    not read (NaN there would poison the product if they were); the result equals the
    masked product over the whole span."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 2, 8, generator=g), torch.randn(2, 2, 40, 8, generator=g),
               torch.randn(2, 2, 40, 8, generator=g))
    at = torch.tensor([[30, 31], [37, 38]])
    mask = (torch.arange(40)[None, None] <= at[:, :, None])[:, None]  # [2, 1, 2, 40]
    whole, _ = packed_gqa_sdpa(None, q, k, v, mask, sliding_window=8)
    k_nan, v_nan = k.clone(), v.clone()
    k_nan[:, :, :23], v_nan[:, :, :23] = float("nan"), float("nan")
    cut, _ = host_attention(None, q, k_nan, v_nan, mask, sliding_window=8)
    torch.testing.assert_close(cut, whole)
    with pytest.raises(AssertionError):  # the window's first slot is read: the check can fail
        k_nan[:, :, 23] = float("nan")
        torch.testing.assert_close(host_attention(None, q, k_nan, v_nan, mask, sliding_window=8)[0], whole)
