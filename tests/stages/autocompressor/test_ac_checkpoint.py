"""Loading published princeton-nlp AutoCompressor checkpoints (tiny fakes with the real
layout: config keys summary_length / accumulate_summary / segment_gradient_checkpointing,
stock llama/opt parameter names plus ``embed_summary.weight``, pytorch_model*.bin files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stages.autocompressor.checkpoint import load_autocompressor
from stages.autocompressor.config import AutoCompressorCompression
from stages.autocompressor.model import ACConfig
from stages.autocompressor.prefill import autocompressor_prefill
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.prompting import PromptParts

K = 5
AC_KEYS = {"summary_length": K, "accumulate_summary": True, "segment_gradient_checkpointing": True}


def _write_fake(d: Path, model, tokenizer, arch: str, shards: int) -> torch.Tensor:
    """Save ``model`` the way the authors' AutoCompressor classes were saved."""
    d.mkdir()
    cfg = model.config.to_dict() | AC_KEYS | {"architectures": [arch]}
    (d / "config.json").write_text(json.dumps(cfg))
    tokenizer.save_pretrained(d)
    summary = torch.randn(K, model.get_input_embeddings().weight.shape[1]) * 0.3
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if cfg["model_type"] == "opt":
        state.pop("lm_head.weight")  # tied to the token embeddings; the OPT files omit it
    state["embed_summary.weight"] = summary
    keys = sorted(state)
    if shards == 1:
        torch.save(state, d / "pytorch_model.bin")
    else:  # the Llama-2 layout: pytorch_model-0000i-of-0000n.bin + index
        weight_map = {}
        for i in range(shards):
            name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
            part = keys[i::shards]
            torch.save({k: state[k] for k in part}, d / name)
            weight_map |= {k: name for k in part}
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return summary


def _prefill_and_decode(lm, ac, tok):
    parts = [
        PromptParts([5, 6], list(range(300, 340)), [7, 8]),
        PromptParts([5], list(range(400, 410)), [9]),
    ]
    cfg = AutoCompressorCompression(checkpoint="unused", segment_tokens=16)
    out = autocompressor_prefill(ac, parts, cfg, tok.pad_token_id)
    results = decode_plain(lm, out.state, DecodeConfig(max_new_tokens=4, eos_ids=frozenset()))
    return out, results


def test_published_llama_layout(tmp_path, tokenizer, make_lm):
    src = make_lm(len(tokenizer), seed=3, initializer_range=0.2, tie_word_embeddings=False).eval()
    summary = _write_fake(
        tmp_path / "ac-llama", src, tokenizer, "LlamaAutoCompressorModel", shards=2
    )
    lm, tok, ac = load_autocompressor(str(tmp_path / "ac-llama"), "float32", torch.device("cpu"))
    assert ac.config == ACConfig(K, True, "contiguous", bos_first_segment=True)
    assert ac.lm is lm
    torch.testing.assert_close(ac.summary_embeddings.data, summary)
    ids = torch.tensor([[1, 50, 60, 70]])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, src(ids).logits)  # stock weights loaded
    out, results = _prefill_and_decode(lm, ac, tok)
    # BOS + 40 tokens -> 3 segments of <= 16; BOS + 10 -> 1 segment
    assert out.context_tokens == [3 * K, K]
    assert all(len(r.tokens) == 4 for r in results)


def test_published_opt_layout_gives_soft_tokens_no_position(tmp_path, tokenizer):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    cfg = OPTConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        word_embed_proj_dim=32,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=2,
        dropout=0.0,
    )
    src = OPTForCausalLM(cfg).eval()
    summary = _write_fake(tmp_path / "ac-opt", src, tokenizer, "AutoCompressorModel", shards=1)
    lm, tok, ac = load_autocompressor(str(tmp_path / "ac-opt"), "float32", torch.device("cpu"))
    assert ac.config == ACConfig(K, True, "text_only", bos_first_segment=True)
    torch.testing.assert_close(ac.summary_embeddings.data, summary)
    ids = torch.tensor([[2, 50, 60, 70]])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, src(ids).logits)

    seen: list[torch.Tensor] = []
    hook = lm.model.decoder.embed_positions.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append(kwargs["position_ids"].clone()), with_kwargs=True
    )
    try:
        out, results = _prefill_and_decode(lm, ac, tok)
    finally:
        hook.remove()
    assert out.context_tokens == [3 * K, K]
    # Compression passes: [soft ; segment ; summary] -> soft/summary get -1 (OPT's
    # padding row, no position), segment tokens count from 0.
    first = seen[0][0].tolist()  # segment 0 of row 0: no soft prompt yet
    assert first == list(range(16)) + [-1] * K
    second = seen[1][0].tolist()  # segment 1 of row 0: K soft vectors in front
    assert second == [-1] * K + list(range(16)) + [-1] * K
    # Prefill of row 1 ([pads ; K soft ; prefix ; query]): text counts from 0 after the soft prompt.
    prefill = seen[3][1].tolist()
    assert prefill[-2:] == [0, 1] and prefill[-2 - K : -2] == [-1] * K
    assert out.state.next_pos.tolist() == [4, 2]  # text tokens only
    assert all(len(r.tokens) == 4 for r in results)


def test_rejects_a_plain_model(tiny_model_dir):
    with pytest.raises(ValueError, match="summary_length"):
        load_autocompressor(str(tiny_model_dir), "float32", torch.device("cpu"))

