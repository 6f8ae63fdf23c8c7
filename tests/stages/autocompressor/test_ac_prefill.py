"""AutoCompressor prefill strategy: batching, soft-prompt placement, decoding hand-off."""

from __future__ import annotations

import pytest
import torch
from ac_cases import assert_rows_as_alone

from stages.autocompressor.config import AutoCompressorCompression
from stages.autocompressor.prefill import autocompressor_prefill, document_segments
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import forward_step
from stages.prompting import PromptParts

PAD = 0


def _parts() -> list[PromptParts]:
    doc = [(i * 7) % 90 + 5 for i in range(40)]
    return [
        PromptParts([1, 10, 11], doc, [20, 21, 22]),  # 3 segments of <= 16
        PromptParts([1, 10], doc[:5], [23, 24]),  # 1 segment
        PromptParts([1], [], [30, 31, 32, 33]),  # no document: no soft prompt
    ]


def test_document_segments():
    doc = list(range(100, 150))
    assert document_segments(doc, 16) == [doc[:16], doc[16:32], doc[32:48], doc[48:]]
    assert document_segments(doc, 16, target_tokens=20) == [doc[30:46], doc[46:]]  # tail kept
    assert document_segments(doc[:3], 16, bos_id=1) == [[1, *doc[:3]]]
    assert document_segments([], 16, bos_id=1) == []


@pytest.mark.parametrize("soft_at", ["start", "document"])
def test_batched_prefill_and_decode_equal_per_row(make_ac, soft_at):
    ac = make_ac(k=4)
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16, soft_prompt_at=soft_at)
    parts = _parts()
    batched = autocompressor_prefill(ac, parts, cfg, PAD)
    assert batched.context_tokens == [12, 4, 0]
    assert len(batched.compress_s) == 3 and batched.state.prefill_s > 0
    # contiguous positions: every soft vector and prompt token takes one position
    assert batched.state.next_pos.tolist() == [12 + 6, 4 + 4, 5]
    assert_rows_as_alone(ac, parts, cfg, batched, PAD, max_new_tokens=8)


@torch.no_grad()
def test_next_pos_continues_the_prompt(make_ac):
    """Decoding one token on top of the prefill == prefilling the prompt with that token."""
    ac = make_ac(k=4)
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16)
    parts = _parts()
    state = autocompressor_prefill(ac, parts, cfg, PAD).state
    feed = torch.tensor([[40], [41], [42]])
    logits, _ = forward_step(
        ac.lm,
        state.cache,
        state.valid,
        feed,
        state.next_pos[:, None],
        torch.ones(3, 1, dtype=torch.bool),
    )
    longer = [
        PromptParts(p.prefix_ids, p.context_ids, p.query_ids + [t])
        for p, t in zip(parts, [40, 41, 42], strict=True)
    ]
    ref = autocompressor_prefill(ac, longer, cfg, PAD).state.last_logits
    torch.testing.assert_close(logits[:, -1], ref, atol=1e-4, rtol=1e-4)


def test_soft_prompt_is_what_the_answer_conditions_on(make_ac):
    ac = make_ac(k=4)
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16)
    p = _parts()[0]
    other = PromptParts(p.prefix_ids, [x + 3 for x in p.context_ids], p.query_ids)
    a = autocompressor_prefill(ac, [p], cfg, PAD).state.last_logits
    b = autocompressor_prefill(ac, [other], cfg, PAD).state.last_logits
    assert not torch.allclose(a, b, atol=1e-3)
    with pytest.raises(ValueError, match="non-empty"):
        autocompressor_prefill(ac, [PromptParts([], [], [])], cfg, PAD)


@pytest.mark.e2e
def test_embedded_model_batched_equals_per_row(embedded_model):
    """The real SmolLM2 (GQA 9/3 heads, chat template): batching rows with 2, 1 and 0
    segments changes nothing. Untrained summary embeddings (EOS init): plumbing only."""
    from stages.autocompressor.model import ACConfig, AutoCompressor
    from stages.prompting import PromptBuilder

    lm, tok = embedded_model
    ac = AutoCompressor(lm, ACConfig(summary_length=8)).eval()
    pb = PromptBuilder(tok)
    text = "The lighthouse keeper logged 42 storms in 1911 and painted the door blue. " * 6
    docs = [pb.encode_text(text)[:100], pb.encode_text(text)[:40], []]
    parts = [pb.build(d, "Answer briefly.", "How many storms?") for d in docs]
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=64)
    decode_cfg = DecodeConfig(max_new_tokens=4, eos_ids=frozenset({tok.eos_token_id}))
    batched = autocompressor_prefill(ac, parts, cfg, tok.pad_token_id)
    assert batched.context_tokens == [16, 8, 0]
    out = decode_plain(lm, batched.state, decode_cfg)
    for i, p in enumerate(parts):
        single = autocompressor_prefill(ac, [p], cfg, tok.pad_token_id)
        assert decode_plain(lm, single.state, decode_cfg)[0].tokens == out[i].tokens


def test_an_unset_segment_length_is_the_one_the_checkpoints_form_was_trained_near(make_ac):
    """segment_tokens unset: 512 for summary vectors (SEGMENT_TOKENS), so 1,030 document tokens
    are three segments of summaries, not the two a 1,024-token segment gives."""
    ac = make_ac(k=4)
    doc = [(i * 7) % 90 + 5 for i in range(1030)]
    parts = [PromptParts([1, 10], doc, [20, 21])]
    unset = autocompressor_prefill(ac, parts, AutoCompressorCompression(checkpoint="unused"), PAD)
    assert unset.context_tokens == [3 * 4]
    wide = autocompressor_prefill(ac, parts, AutoCompressorCompression(checkpoint="unused", segment_tokens=1024), PAD)
    assert wide.context_tokens == [2 * 4]


def test_the_request_fingerprint_holds_the_segment_length_a_run_uses(method_env):
    """Unset, the form decides it, and the fingerprint says so: a kv job keeps the request ids
    of the 1024 it always ran with; a vectors job's ids change with its segments."""
    kv = AutoCompressorCompression(summary_form="kv")
    assert kv.fingerprint_settings()["segment_tokens"] == 1024
    assert kv.fingerprint_settings() == AutoCompressorCompression(summary_form="kv", segment_tokens=1024).fingerprint_settings()
    assert AutoCompressorCompression().fingerprint_settings()["segment_tokens"] == 512  # the shipped vectors
    # a named checkpoint's own form decides (the tiny kv checkpoint)
    named = AutoCompressorCompression(checkpoint=method_env.variants["autocompressor-kv"]["checkpoint"])
    assert named.fingerprint_settings()["segment_tokens"] == 1024 and named.segment_tokens_for("kv") == 1024
