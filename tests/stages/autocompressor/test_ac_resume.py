"""Resumable AutoCompressor training: 4 steps in one run == 2 steps + resume 2 (fp32, dropout
on), the per-step log and curve, the atomic ``last`` directory and the settings check."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from stages.autocompressor import resume
from stages.autocompressor.curve import plot_curve, running_mean
from stages.autocompressor.train import TrainConfig, train


def _corpus(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    words = "river stone lantern orchard copper meadow harbor violet ledger summit".split()
    (data / "a.txt").write_text(" ".join(words[(i * 7) % 10] for i in range(900)))
    return data


def _cfg(tmp_path, tiny_model_dir, out: str, **kw) -> TrainConfig:
    base = dict(
        base_model=str(tiny_model_dir),
        data=(str(tmp_path / "corpus" if (tmp_path / "corpus").exists() else _corpus(tmp_path)),),
        out_dir=str(tmp_path / out),
        summary_length=4,
        block_tokens=64,
        substeps=2,
        segments_per_substep=2,
        min_segment_tokens=8,
        batch_size=2,
        steps=4,
        lr=1e-2,
        warmup_steps=2,
        lora_r=4,
        lora_dropout=0.1,  # dropout draws from torch's RNG: resumption must restore it
        log_every=1,
        device="cpu",
        dtype="float32",
    )
    base.update(kw)
    return TrainConfig(**base)


def _log(out_dir) -> list[dict]:
    with open(out_dir / resume.LOG_FILE, newline="") as f:
        return list(csv.DictReader(f))


def test_two_steps_then_resume_two_equals_four_steps(tmp_path, tiny_model_dir):
    # summary_scale centered: the running summary mean is state the checkpoint must carry too.
    centered = dict(summary_scale="centered")
    whole = train(_cfg(tmp_path, tiny_model_dir, "whole", **centered))
    first = train(_cfg(tmp_path, tiny_model_dir, "split", stop_after=2, **centered))
    assert first.out_dir is None  # interrupted: only the resumable checkpoint exists
    last = tmp_path / "split" / resume.LAST
    assert json.loads((last / "autocompressor.json").read_text())["training"]["step"] == 2
    second = train(_cfg(tmp_path, tiny_model_dir, "split", resume=True, **centered))
    assert second.out_dir == tmp_path / "split"
    a, b = resume.trainable_state(whole.model), resume.trainable_state(second.model)
    assert a.keys() == b.keys() and len(a) > 1
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert whole.model.summary_center.any()
    assert torch.equal(whole.model.summary_center, second.model.summary_center)
    log_a, log_b = _log(tmp_path / "whole"), _log(tmp_path / "split")
    assert [r["step"] for r in log_b] == ["1", "2", "3", "4"]
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]
    assert [r["lr"] for r in log_a] == [r["lr"] for r in log_b]
    # Without restoring the state, steps 3-4 would differ: the checkpoint carried the run.
    fresh = train(_cfg(tmp_path, tiny_model_dir, "fresh", steps=4, stop_after=2, **centered))
    assert not torch.equal(
        resume.trainable_state(fresh.model)["summary_embeddings"], a["summary_embeddings"]
    )


def test_resume_refuses_changed_settings_and_missing_checkpoint(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="no last/train_state.pt"):
        train(_cfg(tmp_path, tiny_model_dir, "none", resume=True))
    train(_cfg(tmp_path, tiny_model_dir, "run", stop_after=1))
    with pytest.raises(ValueError, match="lr was 0.01 in the saved run, now 0.02"):
        train(_cfg(tmp_path, tiny_model_dir, "run", resume=True, lr=2e-2))
    with pytest.raises(ValueError, match="already holds a training checkpoint"):
        train(_cfg(tmp_path, tiny_model_dir, "run"))


def test_save_every_writes_last_atomically_and_a_crash_between_renames_recovers(
    tmp_path, tiny_model_dir
):
    saved: list[int] = []
    real = resume.write_checkpoint

    def spy(ac, out_dir, base_model, info, state):
        saved.append(state["step"])
        return real(ac, out_dir, base_model, info, state)

    resume.write_checkpoint = spy
    try:
        train(_cfg(tmp_path, tiny_model_dir, "run", steps=5, save_every=2))
    finally:
        resume.write_checkpoint = real
    assert saved == [2, 4, 5]
    out = tmp_path / "run"
    assert {p.name for p in out.iterdir()} >= {"last", "train_log.csv", "autocompressor.json"}
    assert not (out / resume.TMP).exists() and not (out / resume.OLD).exists()
    # A kill after `last -> last.old` and before `last.tmp -> last` leaves last.old complete.
    (out / resume.LAST).rename(out / resume.OLD)
    assert resume.find_checkpoint(out) == out / resume.OLD
    info = json.loads((out / "autocompressor.json").read_text())["training"]
    state = resume.load_state(out, info)
    assert state["step"] == 5
    # A training folder is data: a state file that would run code when unpickled is refused
    # (a security review's probe ran its code through `--resume`).
    marker = tmp_path / "ran"

    class Probe:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({**state, "step": Probe()}, out / resume.OLD / resume.STATE_FILE)
    with pytest.raises(Exception, match="Weights only load failed"):
        resume.load_state(out, info)
    assert not marker.exists()


def test_step_log_drops_rows_after_the_resumed_step(tmp_path):
    log = resume.StepLog(tmp_path)
    for s in (1, 2, 3):
        log({"step": s, "loss": 3.0 - s / 10, "lr": 1e-3, "elapsed_s": s, "tokens": 64 * s})
    resume.StepLog(tmp_path, start=2)(
        {"step": 3, "loss": 9.0, "lr": 1e-3, "elapsed_s": 3, "tokens": 192}
    )
    rows = _log(tmp_path)
    assert [(r["step"], r["loss"]) for r in rows] == [("1", "2.9"), ("2", "2.8"), ("3", "9.0")]


def test_plot_curve_writes_a_png_and_refuses_an_empty_log(tmp_path):
    log = resume.StepLog(tmp_path)
    for s in range(1, 31):
        log({"step": s, "loss": 4.0 - s / 20, "lr": 1e-3, "elapsed_s": s, "tokens": s})
    png = plot_curve(tmp_path / resume.LOG_FILE, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    assert running_mean([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    resume.StepLog(tmp_path / "empty")
    with pytest.raises(ValueError, match="no rows"):
        plot_curve(tmp_path / "empty" / resume.LOG_FILE, tmp_path / "e.png")


def test_the_accelerators_generators_are_saved_and_restored_through_its_step_backend(monkeypatch):
    """Beside torch's CPU generator, the state holds this machine's accelerator's generators
    (``cuda_rng`` on CUDA: its step backend's rng_state), restored where that accelerator is."""
    import random

    class Accelerator:  # a stand-in step backend class with a device of its own
        device_type = "fake"
        restored: list = []

        @classmethod
        def rng_state(cls):
            return ["gen0", "gen1"]

        @classmethod
        def set_rng_state(cls, state) -> None:
            cls.restored.append(state)

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.summary_embeddings = torch.nn.Parameter(torch.zeros(2))
            self.register_buffer("summary_center", torch.zeros(2))

    ac = Tiny()
    opt = torch.optim.SGD(ac.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    monkeypatch.setattr(resume, "accelerator_backend", lambda: Accelerator)
    state = resume.capture(1, ac, opt, sched, random.Random(0), 0.0, 0)
    assert state["fake_rng"] == ["gen0", "gen1"]
    resume.restore(state, ac, opt, sched, random.Random(1))
    assert Accelerator.restored == [["gen0", "gen1"]]
    # No accelerator here: none saved, and a state saved with one restores without it.
    monkeypatch.setattr(resume, "accelerator_backend", lambda: None)
    assert not any(k.endswith("_rng") and k not in ("py_rng", "torch_rng") for k in resume.capture(
        1, ac, opt, sched, random.Random(0), 0.0, 0))
    resume.restore(state, ac, opt, sched, random.Random(1))
    assert Accelerator.restored == [["gen0", "gen1"]]
