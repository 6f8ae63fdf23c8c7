"""The autoencoding objective (autoencode_weight): a segment's summary alone must let the
model reproduce the segment; it reaches the summaries where next-token loss cannot."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from stages.autocompressor.train import TrainConfig, fit, make_trainable

N_KEYS, N_SYMBOLS = 2, 16
LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _random_keys(seed: int, batch: int = 32) -> Iterator[torch.Tensor]:
    """Blocks of N_KEYS uniform symbols: unpredictable without a memory of the block."""
    g = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(4, 4 + N_SYMBOLS, (batch, N_KEYS), generator=g)


def test_reconstruction_loss_is_next_token_loss_after_the_summary(make_ac):
    ac = make_ac(vocab=50, k=3)
    ids = torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    summary = torch.randn(2, 3, ac.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = ac.reconstruction_loss(summary, ids)
        # Reference: the decoder's own causal pass over [summary ; marker ; tokens], positions 0..10.
        marker = torch.full((2, 1), ac.lm.config.bos_token_id)
        x = torch.cat([summary, ac.embed(marker), ac.embed(ids)], dim=1)
        h = ac.lm.get_decoder()(inputs_embeds=x, use_cache=False).last_hidden_state
        logits = ac.logits(h[:, 3:-1])  # slot 3 (the marker) predicts ids[:, 0]
        ref = F.cross_entropy(logits.reshape(-1, 50), ids.reshape(-1), reduction="sum")
    assert got.n_tokens == ids.numel()
    torch.testing.assert_close(got.loss_sum, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("weight", [1.0, 0.0])
def test_autoencoding_teaches_a_lone_segment_summary_to_carry_the_segment(make_lm, weight):
    """One segment per substep: its summary feeds nothing, so only reconstruction can train
    it. With weight 1 the summary learns to hold the keys; with weight 0 it never moves."""
    ac = make_trainable(
        make_lm(32, initializer_range=0.2), summary_length=4, lora_r=16, lora_alpha=32,
        lora_dropout=0.0, lora_targets=LORA_ALL,
    )  # fmt: skip
    before = ac.summary_embeddings.detach().clone()
    cfg = TrainConfig(
        steps=300 if weight else 5, lr=1e-2, warmup_steps=10, substeps=1, segments_per_substep=1,
        min_segment_tokens=1, block_tokens=N_KEYS, log_every=50, autoencode_weight=weight,
    )  # fmt: skip
    steps: list[dict] = []
    history = fit(ac, _random_keys(0), cfg, on_step=steps.append)
    if not weight:
        torch.testing.assert_close(ac.summary_embeddings.detach(), before, atol=0, rtol=0)
        assert all(r["ae_loss"] is None for r in steps) and "ae_loss" not in history[-1]
        return
    assert all(math.isfinite(r["ae_loss"]) for r in steps) and "ae_loss" in history[-1]
    held_out = next(_random_keys(123, batch=256))
    with torch.no_grad():
        summary = ac.compress([[k] for k in held_out.tolist()])
        rec = ac.reconstruction_loss(torch.stack(summary), held_out).loss.item()
    # Without a memory the keys cost ln 16 = 2.77 nats each.
    assert rec < 0.3 * math.log(N_SYMBOLS), rec


def test_autoencode_weight_is_range_checked():
    with pytest.raises(ValueError, match=r"autoencode_weight must be in \[0, 100\].*got -1"):
        TrainConfig(autoencode_weight=-1).validate()
