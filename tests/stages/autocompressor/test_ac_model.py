"""AutoCompressor wrapper: summary shapes, accumulation, batching and position schemes."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from stages.autocompressor.model import CENTER_MOMENTUM, ACConfig, position_ids, scheme_for
from stages.autocompressor.train import random_segment_lengths

SEGS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]


@torch.no_grad()
def test_compress_accumulates_one_summary_per_segment(make_ac):
    ac = make_ac(k=3)
    h = ac.hidden_size
    full = ac.compress([SEGS])[0]
    assert full.shape == (9, h)  # 3 segments x K=3, concatenated oldest first
    # Segment s's summary depends only on segments 0..s: prefixes of the document
    # reproduce the leading summaries.
    torch.testing.assert_close(ac.compress([SEGS[:1]])[0], full[:3])
    torch.testing.assert_close(ac.compress([SEGS[:2]])[0], full[:6])
    # ...and every later summary reads the earlier ones: changing segment 0 changes all.
    changed = ac.compress([[[50, 51, 52, 53, 54]] + SEGS[1:]])[0]
    for s in range(3):
        assert not torch.allclose(changed[3 * s : 3 * s + 3], full[3 * s : 3 * s + 3])
    # The K summary vectors of one segment differ from each other.
    assert torch.cdist(full[:3], full[:3]).fill_diagonal_(1.0).min() > 1e-3


@torch.no_grad()
def test_rmt_mode_carries_only_the_last_summary(make_ac):
    ac = make_ac(k=3, accumulate=False)
    out = ac.compress([SEGS])[0]
    assert out.shape == (3, ac.hidden_size)
    # Segment 2 was read with segment 1's summary only, so it is not segment 2's summary
    # read after the accumulated [s0; s1] prompt.
    acc = make_ac(k=3, accumulate=True).compress([SEGS])[0]
    assert torch.allclose(ac.compress([SEGS[:1]])[0], acc[:3])
    assert not torch.allclose(out, acc[6:])


@torch.no_grad()
def test_summary_scale_brings_summaries_to_the_embedding_rms(make_ac):
    raw = make_ac(k=3)
    scaled = make_ac(k=3)
    scaled.config = replace(scaled.config, summary_scale="embedding_rms")
    emb = scaled.lm.get_input_embeddings().weight
    assert scaled.embedding_rms == pytest.approx(float(emb.pow(2).mean(-1).sqrt().mean()))
    ids = torch.tensor([SEGS[0]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    soft = raw.empty_softprompt(1)
    _, plain = raw.segment_forward(soft, ids, valid)
    _, summary = scaled.segment_forward(soft, ids, valid)
    # Same direction, each vector at the embeddings' mean RMS (the raw ones are not).
    rms = summary.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.full_like(rms, scaled.embedding_rms), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        torch.nn.functional.normalize(summary, dim=-1), torch.nn.functional.normalize(plain, dim=-1)
    )
    assert not torch.allclose(plain.pow(2).mean(-1).sqrt(), rms, rtol=0.05)
    # The first segment reads no summary, so the scaling changes what later segments read.
    two = scaled.compress([SEGS[:2]])[0]
    assert not torch.allclose(two[3:], raw.compress([SEGS[:2]])[0][3:])
    with pytest.raises(ValueError, match="summary_scale"):
        ACConfig(summary_length=2, summary_scale="layernorm")  # type: ignore[arg-type]


@torch.no_grad()
def test_centered_summaries_subtract_the_running_mean_kept_in_training(make_ac):
    ac = make_ac(k=3)
    soft = ac.empty_softprompt(2)
    a, b = torch.tensor([SEGS[2], SEGS[2][::-1]]), torch.tensor([SEGS[0], SEGS[0][::-1]])
    _, raw_a = ac.segment_forward(soft, a, torch.ones_like(a, dtype=torch.bool))  # scale none
    _, raw_b = ac.segment_forward(soft, b, torch.ones_like(b, dtype=torch.bool))  # [2, 3, H]
    ac.config = replace(ac.config, summary_scale="centered")

    def summarise(ids: torch.Tensor) -> torch.Tensor:
        return ac.segment_forward(soft, ids, torch.ones_like(ids, dtype=torch.bool))[1]

    ac.train()
    # The first batch is centered by nothing (no earlier batch), then sets the mean.
    torch.testing.assert_close(summarise(a), _at_rms(raw_a, ac.embedding_rms))
    torch.testing.assert_close(ac.summary_center, raw_a.mean(0))
    # A later batch is centered by the earlier mean, then moves it CENTER_MOMENTUM of the way.
    torch.testing.assert_close(summarise(b), _at_rms(raw_b - raw_a.mean(0), ac.embedding_rms))
    moved = raw_a.mean(0).lerp(raw_b.mean(0), CENTER_MOMENTUM)
    torch.testing.assert_close(ac.summary_center, moved)
    # Decoding reads the kept mean and never moves it.
    ac.eval()
    torch.testing.assert_close(summarise(a), _at_rms(raw_a - moved, ac.embedding_rms))
    torch.testing.assert_close(ac.summary_center, moved, atol=0, rtol=0)


def _at_rms(x: torch.Tensor, rms: float) -> torch.Tensor:
    return x * (rms / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())


@torch.no_grad()
def test_batched_compress_equals_per_row(make_ac):
    ac = make_ac(k=4)
    rows = [SEGS, [[3, 4]], [], [[20, 21, 22, 23, 24, 25, 26, 27], [28]]]
    batched = ac.compress(rows)
    assert [t.shape[0] for t in batched] == [12, 4, 0, 8]
    for row, got in zip(rows, batched, strict=True):
        torch.testing.assert_close(got, ac.compress([row])[0], atol=1e-5, rtol=1e-4)


def test_position_schemes():
    real = torch.tensor([[False, True, True, True, True, True]])
    is_text = torch.tensor([[False, False, True, True, False, True]])  # pad, soft, t, t, soft, t
    contiguous = position_ids(real, is_text, "contiguous")
    assert contiguous[0, 1:].tolist() == [0, 1, 2, 3, 4]  # Llama: soft prompt takes positions
    text_only = position_ids(real, is_text, "text_only")
    assert text_only[0, 1:].tolist() == [-1, 0, 1, -1, 2]  # OPT: no position for soft slots
    assert scheme_for("opt") == "text_only" and scheme_for("llama") == "contiguous"
    with pytest.raises(ValueError, match="position_scheme"):
        ACConfig(summary_length=2, position_scheme="rope")  # type: ignore[arg-type]


def test_training_forward_without_summaries_is_plain_lm(make_ac):
    ac = make_ac(k=2)
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = ac(ids, [12], use_summaries=False)
        ref = ac.lm(ids, labels=ids).loss
        torch.testing.assert_close(base.loss, ref, atol=1e-5, rtol=1e-5)
        with_mem = ac(ids, [5, 7])
    assert with_mem.softprompt.shape == (2, 4, ac.hidden_size)
    assert with_mem.n_tokens == 2 * 11  # every next token of both rows
    with pytest.raises(ValueError, match="segment_lengths"):
        ac(ids, [5, 5])


def test_random_segment_lengths():
    rng = random.Random(0)
    seen = set()
    for _ in range(50):
        lens = random_segment_lengths(100, 3, 10, rng)
        assert sum(lens) == 100 and min(lens) >= 10 and len(lens) == 3
        seen.add(tuple(lens))
    assert len(seen) > 10  # randomised, not fixed
    assert random_segment_lengths(40, 1, 10, rng) == [40]
    with pytest.raises(ValueError):
        random_segment_lengths(20, 3, 10, rng)
