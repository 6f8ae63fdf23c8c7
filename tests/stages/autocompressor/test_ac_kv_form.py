"""Summary form kv: the training pass and the inference cache agree, only kept slots reach
what follows, the adapter learns to pack a segment into its kept slots, checkpoints keep
the form."""

from __future__ import annotations

import math

import pytest
import torch
from ac_cases import N_KEYS, N_SYMBOLS, assert_rows_as_alone, copy_task

from stages.autocompressor.checkpoint import load_autocompressor
from stages.autocompressor.config import AutoCompressorCompression
from stages.autocompressor.kv_form import kept_offsets, kv_block_mask, kv_prefill
from stages.autocompressor.model import ACConfig, AutoCompressor
from stages.autocompressor.prefill import autocompressor_prefill
from stages.autocompressor.train import TrainConfig, fit, make_trainable, train
from stages.decoding.state import forward_step
from stages.prompting import PromptParts

PAD = 0
LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def kv_ac(make_lm):
    def build(stride: int = 3, seed: int = 0) -> AutoCompressor:
        lm = make_lm(100, seed=seed, initializer_range=0.2)
        return AutoCompressor(lm, ACConfig(summary_length=1, summary_form="kv", kv_stride=stride)).eval()

    return build


def test_kept_offsets_and_block_mask():
    assert kept_offsets(7, 3) == [2, 5] and kept_offsets(2, 3) == [] and kept_offsets(4, 1) == [0, 1, 2, 3]
    m = kv_block_mask([4, 3], 2, torch.device("cpu"))  # kept: 1, 3 of segment 0; 5 of segment 1
    assert m.shape == (7, 7)
    assert m[3, :4].all() and not m[3, 4:].any()  # segment 0: plain causal
    assert m[5].tolist() == [False, True, False, True, True, True, False]  # kept of 0 + own
    assert m[6].tolist() == [False, True, False, True, True, True, True]


def test_config_and_train_settings_are_checked():
    with pytest.raises(ValueError, match="allowed: vectors, kv"):
        ACConfig(summary_length=1, summary_form="keys")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs substeps 1"):
        TrainConfig(summary_form="kv", substeps=2).validate()
    with pytest.raises(ValueError, match="kv_stride must be >= 1"):
        TrainConfig(summary_form="kv", substeps=1, kv_stride=0).validate()


@torch.no_grad()
def test_inference_cache_scores_what_the_training_pass_scores(kv_ac):
    """NLL of a continuation after kv_prefill (segment by segment, cache trimmed) equals
    the one masked training pass over [segments ; continuation] (fp32)."""
    ac = kv_ac(stride=3)
    doc, cont = [(i * 7) % 90 + 5 for i in range(27)], [41, 42, 43, 44]
    ids = torch.tensor([doc + cont])
    # targets from index 28 on: cont[1:], each predicted from continuation positions
    ref = ac(ids, [16, 11, 4], loss_from=28)
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16)
    res = autocompressor_prefill(ac, [PromptParts([], doc, cont[:1])], cfg, PAD)
    assert res.context_tokens == [len(kept_offsets(16, 3)) + len(kept_offsets(11, 3))]  # 5 + 3
    state = res.state
    logits = [state.last_logits]
    step, _ = forward_step(ac.lm, state.cache, state.valid, torch.tensor([cont[1:3]]),
                           state.next_pos[:, None] + torch.arange(2), torch.ones(1, 2, dtype=torch.bool))
    logits += [step[:, 0], step[:, 1]]
    nll = sum(torch.nn.functional.cross_entropy(lg, torch.tensor([t]), reduction="sum")
              for lg, t in zip(logits, cont[1:], strict=True))
    assert ref.n_tokens == 3
    torch.testing.assert_close(nll, ref.loss_sum, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_only_kept_slots_reach_the_query(kv_ac):
    ac = kv_ac(stride=4)
    doc = [(i * 11) % 90 + 5 for i in range(14)]  # one segment; kept offsets 3, 7, 11
    query = PromptParts([1, 2], doc, [50, 51])
    base = kv_prefill(ac, [query], [[doc]]).state.last_logits
    after_last_kept = doc[:12] + [77, 78]  # tokens 12, 13 are read but not kept
    same = kv_prefill(ac, [query], [[after_last_kept]]).state.last_logits
    torch.testing.assert_close(same, base)
    changed_kept = doc[:11] + [77] + doc[12:]
    assert not torch.allclose(kv_prefill(ac, [query], [[changed_kept]]).state.last_logits, base, atol=1e-4)


@torch.no_grad()
def test_without_a_query_the_last_document_token_reads_kept_slots_only(kv_ac):
    """LM scoring has no query: the last document token takes its place, so what it
    predicts depends on the kept slots and itself, not on the rest of its segment."""
    ac = kv_ac(stride=4)
    doc = [(i * 11) % 90 + 5 for i in range(15)]  # kept offsets 3, 7, 11 (14 is the query)
    res = kv_prefill(ac, [PromptParts([1], doc, [])], [[doc]])
    assert res.context_tokens == [3 + 1]
    changed = doc[:12] + [77, 78] + doc[14:]  # read, not kept, before the last token
    again = kv_prefill(ac, [PromptParts([1], changed, [])], [[changed]])
    torch.testing.assert_close(again.state.last_logits, res.state.last_logits)
    with_query = kv_prefill(ac, [PromptParts([1], doc[:14], doc[14:])], [[doc[:14]]])
    torch.testing.assert_close(with_query.state.last_logits, res.state.last_logits)


def test_batched_rows_prefill_and_decode_as_alone(kv_ac):
    ac = kv_ac(stride=3)
    doc = [(i * 7) % 90 + 5 for i in range(40)]
    parts = [
        PromptParts([1, 10, 11], doc, [20, 21, 22]),
        PromptParts([1], doc[:5], [23, 24]),
        PromptParts([1, 12], [], [30, 31, 32, 33]),  # no document: nothing kept
    ]
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16)
    batched = autocompressor_prefill(ac, parts, cfg, PAD)
    assert batched.context_tokens == [5 + 5 + 2, 1, 0]
    assert batched.state.next_pos.tolist() == [3 + 40 + 3, 1 + 5 + 2, 2 + 4]  # document positions kept
    assert_rows_as_alone(ac, parts, cfg, batched, PAD, max_new_tokens=6)


def test_adapter_learns_to_pack_a_segment_into_its_kept_slot(make_lm):
    """Stride 2 keeps only the second key's slot: recalling the first key needs the adapter
    to write it there. Only the LoRA weights train (the kv form has no summary tokens)."""
    lm = make_lm(32, initializer_range=0.2)
    ac = make_trainable(lm, 1, lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_targets=LORA_ALL,
                        summary_form="kv", kv_stride=N_KEYS)
    assert all("lora_" in n for n, p in ac.named_parameters() if p.requires_grad)
    lengths = [N_KEYS, N_KEYS + 1]
    cfg = TrainConfig(steps=300, lr=1e-2, warmup_steps=10, substeps=1, segments_per_substep=2,
                      min_segment_tokens=1, block_tokens=2 * N_KEYS + 1, log_every=150,
                      summary_form="kv", kv_stride=N_KEYS)
    untrained = ac(next(copy_task(7, 256)), lengths, loss_from=N_KEYS + 1).loss.item()
    fit(ac, copy_task(0), cfg, segmenter=lambda total, rng: lengths)
    with torch.no_grad():
        first_key = ac(next(copy_task(123, 256))[:, : N_KEYS + 2], [N_KEYS, 2], loss_from=N_KEYS + 1)
    assert untrained > 0.5 * math.log(N_SYMBOLS)
    # the first key is never kept itself: recalled only through the second key's slot
    assert first_key.loss.item() < 0.5, (first_key.loss.item(), untrained)


def test_train_job_saves_the_form_and_round_trips(tmp_path, tiny_model_dir):
    data = tmp_path / "corpus"
    data.mkdir()
    words = "river stone lantern orchard copper meadow harbor violet ledger summit".split()
    (data / "a.txt").write_text(" ".join(words[(i * 7) % 10] for i in range(600)))
    cfg = TrainConfig(base_model=str(tiny_model_dir), data=(str(data),), out_dir=str(tmp_path / "ac"),
                      block_tokens=64, substeps=1, segments_per_substep=2, min_segment_tokens=8,
                      batch_size=2, steps=2, lr=1e-2, warmup_steps=1, lora_r=4, log_every=1,
                      device="cpu", summary_form="kv", kv_stride=4)
    result = train(cfg)
    assert all(math.isfinite(r["loss"]) for r in result.history)
    _, _, loaded = load_autocompressor(str(result.out_dir), "float32", torch.device("cpu"))
    assert (loaded.config.summary_form, loaded.config.kv_stride) == ("kv", 4)
    part = PromptParts([1], list(range(100, 130)), [5, 6])
    with torch.no_grad():
        got = kv_prefill(loaded, [part], [[part.context_ids]]).state.last_logits
        want = kv_prefill(result.model, [part], [[part.context_ids]]).state.last_logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # LoRA merged vs unmerged
