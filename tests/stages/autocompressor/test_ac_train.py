"""AutoCompressor training: the summaries learn to carry segment 1 into segment 2; the
job trains only LoRA + summary embeddings and round-trips through its directory."""

from __future__ import annotations

import json
import math

import pytest
import torch
from ac_cases import N_KEYS, N_SYMBOLS, copy_task

from stages.autocompressor.checkpoint import load_autocompressor, load_own
from stages.autocompressor.train import TrainConfig, fit, make_trainable, pick_train_device, train

LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_summary_vectors_carry_segment_one_into_segment_two(make_lm):
    lm = make_lm(32, initializer_range=0.2)
    ac = make_trainable(
        lm, summary_length=4, lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_targets=LORA_ALL
    )
    trainable = {n for n, p in ac.named_parameters() if p.requires_grad}
    assert "summary_embeddings" in trainable
    assert all("lora_" in n for n in trainable - {"summary_embeddings"})
    lengths = [N_KEYS, N_KEYS + 1]
    cfg = TrainConfig(
        steps=200,
        lr=1e-2,
        warmup_steps=10,
        substeps=1,
        segments_per_substep=2,
        min_segment_tokens=1,
        block_tokens=2 * N_KEYS + 1,
        log_every=100,
    )
    history = fit(ac, copy_task(0), cfg, segmenter=lambda total, rng: lengths)
    assert len(history) == 2 and history[-1]["loss"] < history[0]["loss"]
    held_out = next(copy_task(123, batch=256))
    with torch.no_grad():  # loss on segment 2's keys only (targets after SEP)
        with_mem = ac(held_out, lengths, loss_from=N_KEYS + 1).loss.item()
        without = ac(held_out, lengths, use_summaries=False, loss_from=N_KEYS + 1).loss.item()
    # Without memory the keys are uniform over 16 symbols: >= ln 16 = 2.77 nats.
    assert without > 0.9 * math.log(N_SYMBOLS)
    assert with_mem < 0.5 and with_mem < 0.2 * without, (with_mem, without)


def test_train_job_saves_a_small_directory_that_round_trips(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "corpus"
    data.mkdir()
    words = "river stone lantern orchard copper meadow harbor violet ledger summit".split()
    (data / "a.txt").write_text(" ".join(words[i % 10] for i in range(600)))
    (data / "b.jsonl").write_text(
        "\n".join(
            json.dumps({"text": " ".join(words[(i * 3) % 10] for i in range(300))})
            for _ in range(2)
        )
    )
    logs: list[dict] = []
    cfg = TrainConfig(
        base_model=str(tiny_model_dir),
        data=(str(data),),
        out_dir=str(tmp_path / "ac"),
        summary_length=4,
        block_tokens=64,
        substeps=2,
        segments_per_substep=2,
        min_segment_tokens=8,
        batch_size=2,
        steps=3,
        lr=1e-2,
        warmup_steps=1,
        lora_r=4,
        log_every=1,
        device="cpu",
        summary_scale="centered",
    )
    result = train(cfg, on_log=logs.append)
    assert logs[0]["files"] == 2 and logs[0]["blocks"] >= 4
    assert [r["step"] for r in result.history] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in result.history)
    out = result.out_dir
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {
        "autocompressor.json",
        "summary_embeddings.safetensors",
        "adapter/adapter_model.safetensors",
    } <= names
    assert (
        sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 1_000_000
    )  # no base weights

    trained = result.model
    rows = [[list(range(100, 120)), list(range(200, 210))], [list(range(300, 316))]]
    with torch.no_grad():
        expect = trained.compress(rows)
        lm, _, merged = load_autocompressor(str(out), "float32", torch.device("cpu"))
        unmerged, _ = load_own(out, "float32", torch.device("cpu"), merge=False)
        base = make_trainable(lm.__class__.from_pretrained(tiny_model_dir), 4, lora_r=0)
        base.summary_embeddings.data.copy_(merged.summary_embeddings.data)
        no_lora = base.compress(rows)
    assert not hasattr(lm, "peft_config")  # LoRA merged for decoding
    assert merged.config.summary_scale == "centered"  # the run's setting, saved and read
    torch.testing.assert_close(merged.summary_embeddings.data, trained.summary_embeddings.data)
    assert trained.summary_center.abs().sum() > 0  # the running mean was kept and saved
    torch.testing.assert_close(merged.summary_center, trained.summary_center)
    for got, ref in zip(unmerged.compress(rows), expect, strict=True):
        torch.testing.assert_close(got, ref)
    for got, ref, plain in zip(merged.compress(rows), expect, no_lora, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain, ref, atol=1e-4)  # the adapter was trained and loaded
    # A centered checkpoint whose file lost the running mean is refused, naming the file.
    from safetensors.torch import load_file, save_file

    summary_file = out / "summary_embeddings.safetensors"
    save_file(
        {"summary_embeddings": load_file(str(summary_file))["summary_embeddings"]},
        str(summary_file),
    )
    with pytest.raises(
        ValueError, match=r"summary_embeddings.safetensors: summary_scale is centered"
    ):
        load_own(out, "float32", torch.device("cpu"))


def test_the_training_device_is_one_a_step_backend_runs_on_and_torch_sees():
    assert pick_train_device("cpu") == torch.device("cpu")
    assert pick_train_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match=r"device 'bogus!' not supported .*allowed: auto, or a device"):
        pick_train_device("bogus!")
    if not torch.cuda.is_available():  # named, but not on this machine: said before any model loads
        with pytest.raises(ValueError, match="no such device is visible to torch here; use auto or cpu"):
            pick_train_device("cuda:1")


def test_lora_targets_the_model_lacks_are_refused_with_its_projection_names(make_lm):
    with pytest.raises(ValueError) as e:
        make_trainable(make_lm(32), summary_length=4, lora_r=4, lora_alpha=8, lora_dropout=0.0,
                       lora_targets=("c_attn",))
    said = str(e.value)
    assert "none of the LoRA targets ['c_attn'] exist in the model" in said
    assert "q_proj" in said and "pass --lora-targets with those" in said and "--lora-r 0" in said
