"""`longdoc train-autocompressor` command function: options -> training -> saved directory."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from pipeline.train.autocompressor import train_autocompressor


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("train-autocompressor")(train_autocompressor)
    app.command("noop")(lambda: None)  # two commands keep the subcommand name in the CLI
    return app


def test_cli_trains_and_saves(tmp_path, tiny_model_dir):
    (tmp_path / "doc.txt").write_text(" ".join(f"word{i % 37}" for i in range(800)))
    out = tmp_path / "ac"
    args = [
        "train-autocompressor",
        "--data",
        str(tmp_path / "doc.txt"),
        "--out",
        str(out),
        "--base-model",
        str(tiny_model_dir),
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
    assert "step      2  loss" in res.output and "ae_loss" in res.output and "tok/s" in res.output
    assert (out / "autocompressor.json").is_file() and "saved" in res.output


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
    assert "step      3  loss" in second.output and "saved" in second.output
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
