"""Roofline figures: bandwidth table, bytes per decode step, tokens/s bound."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from pipeline.bench import roofline
from stages.random_models import random_config


@pytest.mark.parametrize(
    ("name", "gbps"),
    [("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000), ("NVIDIA H200", 4800),
     ("NVIDIA H100 NVL", 3900), ("Some New GPU", None)],
)
def test_nominal_bandwidth_by_device_name(name, gbps):
    """The CUDA backend's data-sheet table (no GPU needed: the name is given)."""
    got = roofline.nominal_bandwidth(torch.device("cuda"), name)
    assert got == (gbps * 1e9 if gbps else None)


def test_no_nominal_bandwidth_for_the_host_whatever_its_name():
    """A CPU model name holding a GPU's substring ("L4", "T4") gets no data-sheet figure."""
    assert roofline.nominal_bandwidth(torch.device("cpu"), "Intel(R) Xeon(R) L4 T4 H100") is None


def test_8b_step_bytes_leave_out_the_untied_input_embedding():
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(random_config("random:llama-8b"), dtype=torch.bfloat16)
    weights, kv = roofline.step_bytes(model, batch=8, context=1000)
    assert weights == 2 * (8_030_261_248 - 128256 * 4096)
    assert roofline.kv_bytes_per_token(model) == 2 * 32 * 8 * 128 * 2
    assert kv == 8 * 1000 * 131072
    # Batch 1 at 3.35 TB/s: ~223 tok/s from the weights alone (the "~200").
    assert 220 < roofline.roofline_tok_s(1, weights, 0, 3.35e12) < 226


def test_tied_embedding_is_read_once():
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(random_config("random:smollm2-135m"), dtype=torch.float32)
    assert roofline.weight_bytes_per_step(model) == 4 * sum(p.numel() for p in model.parameters())


def test_cpu_copy_bandwidth_is_measured():
    bw = roofline.measure_bandwidth(torch.device("cpu"), nbytes=2**24, repeats=2)
    assert 1e8 < bw < 1e13
    assert roofline.device_name(torch.device("cpu"))
