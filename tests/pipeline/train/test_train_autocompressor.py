"""`longdoc train-autocompressor` command function: options -> training -> saved directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from pipeline.train.autocompressor import train_autocompressor


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("train-autocompressor")(train_autocompressor)
    app.command("noop")(lambda: None)  # two commands keep the subcommand name in the CLI
    return app


def test_cli_trains_and_saves(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "doc.txt").write_text(" ".join(f"word{i % 37}" for i in range(800)))
    out = tmp_path / "ac"
    monkeypatch.chdir(tiny_model_dir.parent)  # the base named by a relative path, as a user does
    args = [
        "train-autocompressor",
        "--data",
        str(tmp_path / "doc.txt"),
        "--out",
        str(out),
        "--base-model",
        tiny_model_dir.name,
        "--summary-length",
        "4",
        "--block-tokens",
        "64",
        "--min-segment-tokens",
        "8",
        "--steps",
        "2",
        "--log-every",
        "1",
        "--lora-r",
        "4",
        "--device",
        "cpu",
        "--autoencode-weight",
        "0.5",
    ]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    assert "step      2/2  loss" in res.output and "ae_loss" in res.output and "tok/s" in res.output
    assert "step      1/2  loss" in res.output and " left" in res.output  # how far, how long
    # the default warmup (50 steps) is longer than the run: said, not left to find in the curve
    assert "note: --warmup-steps 50 >= --steps 2: the learning rate never reaches --lr" in res.output
    assert (out / "autocompressor.json").is_file() and "saved" in res.output
    # the checkpoint names its base absolutely: it loads from any folder
    assert json.loads((out / "autocompressor.json").read_text())["base_model"] == str(tiny_model_dir.resolve())


def test_cli_reports_bad_values(tmp_path, tiny_model_dir):
    args = [
        "train-autocompressor",
        "--data",
        str(tmp_path / "missing"),
        "--base-model",
        str(tiny_model_dir),
    ]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 2 and "does not exist" in res.output
    # refused before any model loads: a base model that is not there, a learning rate of no use
    res = CliRunner().invoke(_app(), [*args[:3], "--base-model", str(tmp_path / "no-model")])
    assert res.exit_code == 2 and "--base-model: no folder" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(_app(), [*args, "--lr", "-1"])
    assert res.exit_code == 2 and "lr must be a positive number" in res.output
    res = CliRunner().invoke(_app(), [*args[:1], "--autoencode-weight", "-1"])
    assert res.exit_code == 2 and "autoencode_weight must be in [0, 100]" in res.output
    res = CliRunner().invoke(_app(), [*args[:1], "--summary-form", "kv"])  # default substeps 2
    assert res.exit_code == 2 and "summary_form kv reads a block in one masked pass" in res.output
    res = CliRunner().invoke(_app(), [*args[:1], "--summary-form", "keys"])
    said = " ".join(res.output.replace("│", " ").split())  # typer's refusal of an Enum option, out of its box
    assert res.exit_code == 2 and "'keys' is not one of 'vectors', 'kv'" in said


def test_cli_stops_resumes_logs_and_plots(tmp_path, tiny_model_dir):
    (tmp_path / "doc.txt").write_text(" ".join(f"word{(i * 5) % 37}" for i in range(800)))
    out = tmp_path / "ac"
    base = ["train-autocompressor", "--data", str(tmp_path / "doc.txt"), "--out", str(out)]
    base += ["--base-model", str(tiny_model_dir), "--summary-length", "4", "--block-tokens", "64"]
    base += ["--min-segment-tokens", "8", "--steps", "3", "--lora-r", "4", "--device", "cpu"]
    first = CliRunner().invoke(_app(), [*base, "--stop-after", "2", "--save-every", "1"])
    assert first.exit_code == 0, first.output
    assert "stopped before --steps" in first.output and (out / "last" / "train_state.pt").is_file()
    assert not (out / "autocompressor.json").exists()
    again = CliRunner().invoke(_app(), base)  # without --resume the checkpoint is protected
    assert again.exit_code == 2 and "already holds a training checkpoint" in again.output
    second = CliRunner().invoke(_app(), [*base, "--resume"])
    assert second.exit_code == 0, second.output
    assert "step      3/3  loss" in second.output and "saved" in second.output
    lines = (out / "train_log.csv").read_text().splitlines()
    assert lines[0] == "step,loss,lr,elapsed_s,tokens,ae_loss" and [x.split(",")[0] for x in lines[1:]] == [
        "1",
        "2",
        "3",
    ]
    ship = tmp_path / "ship"
    exported = CliRunner().invoke(
        _app(), ["train-autocompressor", "--out", str(out), "--export", str(ship)]
    )
    assert exported.exit_code == 0, exported.output
    names = {p.relative_to(ship).as_posix() for p in ship.rglob("*") if p.is_file()}
    assert names == {
        "autocompressor.json",
        "summary_embeddings.safetensors",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    }
    (out / "train_curve.png").unlink()
    plot = CliRunner().invoke(_app(), ["train-autocompressor", "--out", str(out), "--plot-only"])
    assert plot.exit_code == 0 and (out / "train_curve.png").read_bytes()[:4] == b"\x89PNG"
    none = CliRunner().invoke(
        _app(), ["train-autocompressor", "--out", str(tmp_path / "x"), "--plot-only"]
    )
    assert none.exit_code == 2 and "no " in none.output


def test_an_interrupted_training_says_where_its_last_save_is_and_how_to_go_on(tmp_path, tiny_model_dir):
    """Ctrl-C while it trains: exit 130 with the last step, the last save and --resume."""
    (tmp_path / "doc.txt").write_text(" ".join(f"word{(i * 3) % 37}" for i in range(800)))
    out = tmp_path / "ac"
    cmd = [str(Path(sys.executable).parent / "longdoc"), "train-autocompressor", "--data", str(tmp_path / "doc.txt"),
           "--out", str(out), "--base-model", str(tiny_model_dir), "--summary-length", "4", "--block-tokens", "64",
           "--min-segment-tokens", "8", "--steps", "100000", "--lora-r", "4", "--device", "cpu",
           "--log-every", "1", "--save-every", "1", "--warmup-steps", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:  # the second step printed: one save at least is on disk
            if line.startswith("step") and "      2/100000" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted (the last step printed: " in err and "of 100000)" in err, err[-2000:]
    assert f"is in {out / 'last'}: run the same command with --resume" in err and "Traceback" not in err
