"""The first documents against the model's context (pipeline/fits.py), with the embedded
tokenizer's files: method none is told which documents will be error rows; a method with
a budget or one reading any length is not checked."""

from __future__ import annotations

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.fits import first_fit
from schemas.loading import spec_from_dict

LONG = "The board approved the budget of the plant. " * 1500  # ~13,500 tokens


def _spec(tmp_path, compression: dict | None = None):
    corpus = tmp_path / "docs"
    corpus.mkdir(exist_ok=True)
    (corpus / "a-long.txt").write_text(LONG)
    (corpus / "b-short.txt").write_text("A short memo.")
    raw = {"name": "fit", "input": {"uri": str(corpus)}, "output": {"uri": str(tmp_path / "out")}}
    return spec_from_dict({**raw, "compression": compression} if compression else raw)


def test_some_documents_too_long_are_a_note_naming_them(tmp_path, tokenizer):
    fit = first_fit(_spec(tmp_path), None)
    assert fit is not None and fit.counted == 2 and [name for name, _ in fit.long] == ["a-long.txt"]
    need = fit.long[0][1]
    assert need > len(tokenizer(LONG, add_special_tokens=False)["input_ids"])  # the prompt's frame too
    assert fit.refusal() is None
    assert "1 of the first 2 document(s) are too long for method 'none'" in fit.note()
    res = CliRunner().invoke(app, ["validate", str(_write(tmp_path))])
    assert res.exit_code == 0 and f"'a-long.txt' needs {need} prompt tokens" in res.output


def test_methods_with_a_budget_or_reading_any_length_are_not_checked(tmp_path, tokenizer):
    assert first_fit(_spec(tmp_path, {"method": "truncate", "target_tokens": 512}), None) is None
    assert first_fit(_spec(tmp_path, {"method": "finch"}), None) is None


def _write(tmp_path):
    import yaml

    _spec(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "fit", "input": {"uri": str(tmp_path / "docs")},
                                    "output": {"uri": str(tmp_path / "out")}}))
    return path
