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
    assert fit is not None and [name for name, _ in fit.tokens] == ["a-long.txt", "b-short.txt"]
    need = dict(fit.tokens)["a-long.txt"] + fit.frame  # the prompt's frame too
    assert dict(fit.tokens)["a-long.txt"] == len(tokenizer(LONG, add_special_tokens=False)["input_ids"])
    assert fit.refusal() is None
    assert "1 of the first 2 document(s) are too long for method 'none'" in fit.note()
    res = CliRunner().invoke(app, ["validate", str(_write(tmp_path))])
    assert res.exit_code == 0 and f"'a-long.txt' needs {need} prompt tokens" in res.output


def test_methods_with_a_budget_or_reading_any_length_are_not_held_to_the_context(tmp_path, tokenizer):
    for compression in ({"method": "rag", "target_tokens": 512}, {"method": "finch"}):
        fit = first_fit(_spec(tmp_path, compression), None)
        assert fit is not None and fit.refusal() is None and fit.note() == ""


def _write(tmp_path):
    import yaml

    _spec(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "fit", "input": {"uri": str(tmp_path / "docs")},
                                    "output": {"uri": str(tmp_path / "out")}}))
    return path


def test_truncate_says_how_much_of_a_long_document_it_shows_and_what_fits(tmp_path, tokenizer):
    """A summaries night under truncate read 1.6% of a 63,000-token report without a word."""
    fit = first_fit(_spec(tmp_path, {"method": "truncate", "target_tokens": 512, "keep": "head_tail"}), None)
    assert fit is not None and fit.refusal() is None
    longest = dict(fit.tokens)["a-long.txt"]
    assert (f"truncate shows the model 512 tokens of 1 of the first 2 document(s) (keep head_tail: "
            f"{100 * 512 / longest:.1f}% of the longest, 'a-long.txt', {longest} tokens); "
            f"compression.target_tokens up to {8192 - fit.frame - 128} fits") in fit.note()


def test_documents_over_max_doc_tokens_and_empty_files_are_named_before_the_run(tmp_path, tokenizer):
    spec = _spec(tmp_path, {"method": "select"})
    (tmp_path / "docs" / "c-empty.txt").write_text("  \n")
    spec = spec.model_copy(update={"input": spec.input.model_copy(update={"max_doc_tokens": 5000})})
    note = first_fit(spec, None).note()
    assert "1 of the first 2 document(s) are over input.max_doc_tokens 5000" in note and "'a-long.txt'" in note
    from pipeline.preflight import first_records_note

    assert "1 of its first 3 document(s) will be error rows" in first_records_note(spec, None)
    assert "c-empty.txt is empty" in first_records_note(spec, None)


def test_the_note_counts_a_document_over_max_doc_tokens_as_the_tokenize_stage_fails_it(tmp_path):
    """At the limit a document passes, one token over it is an error row: the note and the
    stage's check (stages/read.py doc_tokens_error) draw the line at the same token."""
    from pipeline.fits import Fit
    from stages.read import doc_tokens_error

    spec = spec_from_dict({"name": "fit", "input": {"uri": str(tmp_path / "docs"), "max_doc_tokens": 100},
                           "output": {"uri": str(tmp_path / "out")}, "compression": {"method": "finch"}})
    fit = Fit(spec, 8192, 50, (("at.txt", 100), ("over.txt", 101)), whole=False)
    assert [doc_tokens_error(n, spec.input, name) is not None for name, n in fit.tokens] == [False, True]
    assert ("1 of the first 2 document(s) are over input.max_doc_tokens 100 and will be error rows "
            "(the first: 'over.txt', 101 tokens)") in fit.note()


def test_truncate_names_the_longest_of_the_documents_it_cuts(tmp_path):
    from pipeline.fits import Fit

    spec = spec_from_dict({"name": "fit", "input": {"uri": str(tmp_path / "docs")},
                           "output": {"uri": str(tmp_path / "out")},
                           "compression": {"method": "truncate", "target_tokens": 512}})
    note = Fit(spec, 8192, 50, (("short.txt", 300), ("a.txt", 600), ("b.txt", 1024)), whole=False).note()
    assert "512 tokens of 2 of the first 3 document(s) (keep head_tail: 50.0% of the longest, 'b.txt', 1024 tokens)" in note


def test_truncate_says_so_when_it_shows_every_token(tmp_path):
    """A new user's six short documents under truncate 1024 got no word on the share shown,
    which the README promises: silence read as the check not having run."""
    from pipeline.fits import Fit

    spec = spec_from_dict({"name": "fit", "input": {"uri": str(tmp_path / "docs")},
                           "output": {"uri": str(tmp_path / "out")},
                           "compression": {"method": "truncate", "target_tokens": 1024}})
    note = Fit(spec, 8192, 50, (("short.txt", 300), ("b.txt", 1024)), whole=False).note()
    assert note == (" (truncate shows the model every token of the first 2 document(s): the longest, "
                    "'b.txt', 1024 tokens, is within compression.target_tokens 1024)")
    assert "shows the model every token" not in Fit(spec, 8192, 50, (("b.txt", 1025),), whole=False).note()
    # A document over input.max_doc_tokens is an error row, not a document shown whole.
    capped = spec.model_copy(update={"input": spec.input.model_copy(update={"max_doc_tokens": 2000})})
    note = Fit(capped, 8192, 50, (("short.txt", 300), ("b.txt", 1024), ("huge.txt", 5000)), whole=False).note()
    assert "every token of the first 3 document(s) but the 1 over input.max_doc_tokens: the longest, 'b.txt'" in note, note


def test_a_document_that_exactly_fills_the_context_fits(tmp_path):
    """Method none: a document whose prompt and answer exactly fill the context is no error
    row (stages/context_budget.py over_context draws the line there); one token more is."""
    from pipeline.fits import Fit
    from stages.context_budget import over_context

    spec = spec_from_dict({"name": "fit", "input": {"uri": str(tmp_path / "docs")},
                           "output": {"uri": str(tmp_path / "out")}, "generation": {"max_new_tokens": 100}})
    room = 1000 - 50 - 100
    assert over_context("a", room + 50, 100, 1000) is None and over_context("b", room + 51, 100, 1000)
    fits = Fit(spec, 1000, 50, (("a.txt", room), ("b.txt", 10)), whole=True)
    assert fits.refusal() is None and fits.note() == ""
    assert "1 of the first 2 document(s) are too long" in Fit(
        spec, 1000, 50, (("a.txt", room + 1), ("b.txt", 10)), whole=True).note()
