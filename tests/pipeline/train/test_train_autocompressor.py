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
    ]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    assert "step      2  loss" in res.output and "tok/s" in res.output
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
