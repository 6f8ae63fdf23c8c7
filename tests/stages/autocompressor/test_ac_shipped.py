"""The AutoCompressor checkpoints shipped for the embedded SmolLM2-135M: present as package
data, the summary-vector one the default for ``compression.method: autocompressor`` on the
embedded model (the kv form under ``summary_form: kv``), and a ValueError naming
``compression.checkpoint`` for any other model."""

from __future__ import annotations

import pytest
import torch

from schemas.spec import EMBEDDED_MODEL, JobSpec
from stages.autocompressor.checkpoint import (
    SHIPPED_DIR,
    checkpoint_form,
    load_autocompressor,
    read_own_config,
    resolve_checkpoint,
    shipped_checkpoint,
)
from stages.compression import method_for

SPEC = {"name": "ac", "input": {"uri": "docs/"}, "compression": {"method": "autocompressor"}}


VECTORS = SHIPPED_DIR / "smollm2-135m-instruct"  # the paper's form: the default
KV = SHIPPED_DIR / "smollm2-135m-instruct-kv"  # the named variant


def _files(d) -> dict[str, int]:
    return {p.relative_to(d).as_posix(): p.stat().st_size for p in d.rglob("*") if p.is_file()}


def test_the_embedded_model_ships_both_forms_summary_vectors_by_default():
    assert shipped_checkpoint(EMBEDDED_MODEL) == VECTORS == shipped_checkpoint(EMBEDDED_MODEL, "vectors")
    assert checkpoint_form(str(VECTORS)) == "vectors" and checkpoint_form("princeton-nlp/any") == "vectors"
    d = shipped_checkpoint(EMBEDDED_MODEL, "kv")
    assert d == KV and checkpoint_form(str(d)) == "kv"
    meta = read_own_config(d)
    assert meta["base_model"] == EMBEDDED_MODEL and meta["lora"]
    assert (meta["summary_form"], meta["kv_stride"]) == ("kv", 10)
    assert meta["training"]["step"] >= 1 and meta["training"]["device"] == "cpu"
    for ckpt in (d, VECTORS):
        files = _files(ckpt)
        assert {"autocompressor.json", "summary_embeddings.safetensors", "adapter/adapter_model.safetensors"} <= set(files)
        assert "train_state.pt" not in files and sum(files.values()) < 10_000_000  # no optimizer, no base weights
    assert read_own_config(VECTORS)["summary_length"] == 50


def test_resolve_checkpoint_defaults_only_for_the_embedded_model():
    assert resolve_checkpoint(None, EMBEDDED_MODEL) == str(VECTORS)
    assert resolve_checkpoint(None, EMBEDDED_MODEL, "kv") == str(KV)
    assert resolve_checkpoint("/my/ckpt", "org/other-model") == "/my/ckpt"
    with pytest.raises(ValueError, match=r"summary_form 'gist'; allowed: vectors, kv"):
        resolve_checkpoint(None, EMBEDDED_MODEL, "gist")
    with pytest.raises(
        ValueError, match=r"compression\.checkpoint is not set .* 'org/other-model'"
    ):
        resolve_checkpoint(None, "org/other-model")


def test_method_uses_the_shipped_checkpoint_when_the_spec_names_none():
    job = JobSpec.model_validate(SPEC)
    assert job.compression.checkpoint is None
    method = method_for(job.compression)
    assert method.checkpoint(job) == str(shipped_checkpoint(EMBEDDED_MODEL))
    assert method.tokenizer_source(job) == EMBEDDED_MODEL
    other = JobSpec.model_validate({**SPEC, "generation": {"model": "org/other-model"}})
    with pytest.raises(ValueError, match=r"compression\.checkpoint"):
        method.tokenizer_source(other)


def test_shipped_checkpoints_load_and_their_training_changed_the_model():
    from stages.autocompressor.kv_form import kv_prefill
    from stages.model_loading import load_causal_lm
    from stages.prompting import PromptParts

    lm, tok, ac = load_autocompressor(str(VECTORS), "float32")
    eos = lm.get_input_embeddings().weight[tok.eos_token_id].float()
    # summary embeddings start as copies of EOS's embedding; training moved them apart
    assert not torch.allclose(ac.summary_embeddings[0], eos, atol=1e-3)
    assert not torch.allclose(ac.summary_embeddings[0], ac.summary_embeddings[1], atol=1e-4)
    ids = tok("The interpreter reads a line, runs it and prints the result.").input_ids
    with torch.no_grad():
        (soft,) = ac.compress([[ids[:8], ids[8:]]])
    assert soft.shape == (2 * 50, lm.config.hidden_size) and torch.isfinite(soft).all()

    _, _, kv = load_autocompressor(str(KV), "float32")
    base, _ = load_causal_lm(EMBEDDED_MODEL, "float32")
    q = kv.lm.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(q, base.model.layers[0].self_attn.q_proj.weight)  # LoRA merged in
    doc = tok("The interpreter reads a line, runs it and prints the result. " * 6).input_ids
    part = PromptParts([tok.bos_token_id], doc, tok(" It prints").input_ids)
    res = kv_prefill(kv, [part], [[doc]])
    assert res.context_tokens == [len(doc) // 10] and torch.isfinite(res.state.last_logits).all()
