"""Bad specs and command lines are refused before Ray starts, naming the field.

One table: each case is a spec mistake (a YAML patch over a valid spec, or raw YAML)
or a command-line mistake, with the strings its message must hold: the field path,
the bad value and what is allowed. Every spec case goes through `longdoc validate`
and `longdoc run` in-process (typer's CliRunner), the pure ones also through
`longdoc submit`; each must exit 2 without reaching the code that starts or contacts
Ray (``run_job``, the Jobs API client), and leave Ray uninitialised when it was.
"""

from __future__ import annotations

import sys

import pytest
import ray
import yaml
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
NO_CLUSTER = "http://127.0.0.1:9"  # discard port: a refusal must come before any request


def _base(tmp_path) -> dict:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.txt").write_text("A short document.")
    return {"name": "refuse", "input": {"uri": str(corpus)}, "output": {"uri": str(tmp_path / "out")}}


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for k, v in patch.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


# (id, patch over the base spec, substrings the message must hold, pure: no machine checks)
SPEC_CASES = [
    ("scheme-hdfs", {"input": {"uri": "hdfs://nn/corpus"}}, ["input.uri", "'hdfs://'", "s3://", "plain path"], True),
    ("scheme-http", {"input": {"uri": "http://host/c"}}, ["input.uri", "'http://'", "memory://"], True),
    ("scheme-out-ftp", {"output": {"uri": "ftp://h/o"}}, ["output.uri", "'ftp://'", "gs://"], True),
    ("scheme-chain", {"input": {"uri": "simplecache::s3://b/c"}}, ["input.uri", "simplecache::s3", "file://"], True),
    ("uri-one-slash", {"input": {"uri": "s3:/bucket/c"}}, ["input.uri", "'s3:/bucket/c'", "s3://"], True),
    ("uri-empty", {"input": {"uri": ""}}, ["input.uri", "empty", "allowed"], True),
    ("placeholder-in", {"input": {"uri": "/data/{jbo}/"}}, ["input.uri", "{jbo}", "allowed: {run_date}"], True),
    ("placeholder-job-in", {"input": {"uri": "/data/{job}/"}}, ["input.uri", "{job}", "allowed: {run_date}"], True),
    ("placeholder-out", {"output": {"uri": "out/{jbo}"}}, ["output.uri", "{jbo}", "{job}, {run_date}"], True),
    ("brace-unbalanced", {"input": {"uri": "/data/{run_date"}}, ["input.uri", "unbalanced", "{run_date}"], True),
    ("embedded-model", {"generation": {"model": "embedded:llama-7b"}},
     ["generation.model", "embedded:llama-7b", "embedded:smollm2-135m-instruct"], True),
    ("embedded-embedder", {"compression": {"method": "rag", "embedder": "embedded:e5"}},
     ["compression.embedder", "embedded:e5", "embedded:all-minilm-l6-v2"], True),
    ("none-target", {"compression": {"method": "none", "target_tokens": 512}},
     ["compression.target_tokens", "'none' takes no target_tokens", "truncate", "finch"], True),
    ("method-unknown", {"compression": {"method": "zip"}}, ["compression.method", "'zip'", "'finch'"], True),
    ("method-missing", {"compression": {"target_tokens": 9}}, ["compression.method", "missing", "truncate"], True),
    ("truncate-keep", {"compression": {"method": "truncate", "keep": "middle"}},
     ["compression.keep", "'middle'", "'head_tail'"], True),
    ("method-field", {"compression": {"method": "truncate", "chunk": 3}},
     ["compression.chunk", "method 'truncate'", "target_tokens, keep"], True),
    ("typo-field", {"generation": {"temprature": 0.5}},
     ["generation.temprature", "allowed: model", "did you mean 'temperature'"], True),
    ("typo-top", {"outptu": {"uri": "o"}}, ["outptu", "allowed: name, input", "did you mean 'output'"], True),
    ("max-new-0", {"generation": {"max_new_tokens": 0}}, ["generation.max_new_tokens", "got 0", ">= 1"], True),
    ("temperature-9", {"generation": {"temperature": 9}}, ["generation.temperature", "got 9", "<= 5"], True),
    ("dtype", {"generation": {"dtype": "fp8"}}, ["generation.dtype", "'fp8'", "'bfloat16'"], True),
    ("actors-order", {"resources": {"actors": [3, 1]}}, ["resources.actors", "[3, 1]", "1 <= min <= max"], True),
    ("actors-word", {"resources": {"actors": "many"}}, ["resources.actors", "'many'", "an integer or a list"], True),
    ("ngram-order", {"generation": {"speculative": {"min_ngram": 5, "max_ngram": 2}}},
     ["generation.speculative.min_ngram", "got 5", "<= max_ngram (2)"], True),
    ("qa-no-questions", {"task": {"kind": "qa"}}, ["task.questions", "qa", "input.question_field"], True),
    ("format-csv", {"input": {"format": "csv"}}, ["input.format", "'csv'", "'jsonl'"], True),
    ("format-vs-file", {"input": {"uri": "/data/docs.parquet", "format": "jsonl"}},
     ["input.format", "docs.parquet", "allowed for jsonl: .jsonl", "format: parquet"], True),
    ("output-is-input", {"output": {"uri": "/data/c"}, "input": {"uri": "/data/c"}},
     ["output.uri", "'/data/c'", "allowed: a location outside the input"], True),
    ("output-in-input", {"output": {"uri": "/data/c/out"}, "input": {"uri": "/data/c/"}},
     ["output.uri", "'/data/c/out'", "inside it", "outside the input"], True),
    ("answers-no-questions", {"input": {"answer_field": "answers", "format": "jsonl"},
                              "task": {"kind": "qa", "questions": ["Q?"]}},
     ["input.answer_field", "'answers'", "input.question_field"], True),
    ("summarize-questions", {"task": {"questions": ["Who?"]}},
     ["task.questions", "('Who?',)", "task.kind summarize", "allowed: set task.kind: qa"], True),
    ("summarize-question-field", {"input": {"question_field": "qs", "format": "jsonl"}},
     ["input.question_field", "'qs'", "set task.kind: qa"], True),
    ("empty-text-field", {"input": {"text_field": ""}}, ["input.text_field", "got ''", "at least 1 character"], True),
    ("empty-stop", {"generation": {"stop": ["</s>", ""]}}, ["generation.stop[1]", "got ''", "at least 1"], True),
    ("name-slash", {"name": "a/b"}, ["name", "'a/b'", "A-Z a-z 0-9 . _ -"], True),
    ("name-colon", {"name": "nightly:contracts"}, ["name", "'nightly:contracts'", "path-safe"], True),
    ("max-doc-tokens-0", {"input": {"max_doc_tokens": 0}}, ["input.max_doc_tokens", "got 0", ">= 1"], True),
    ("max-doc-bytes-word", {"input": {"max_doc_bytes": "lots"}}, ["input.max_doc_bytes", "'lots'", "an integer"], True),
    ("section-scalar", {"input": "/data"}, ["input", "'/data'", "a mapping of fields"], True),
    ("model-local-missing", {"generation": {"model": "./no-such-model"}},
     ["generation.model", "'./no-such-model'", "does not exist", "Hugging Face id"], False),
    ("checkpoint-missing", {"compression": {"method": "autocompressor", "checkpoint": "/no/such/ckpt"}},
     ["compression.checkpoint", "'/no/such/ckpt'", "does not exist"], False),
    ("input-missing", {"input": {"uri": "/no/such/corpus"}},
     ["input.uri", "'/no/such/corpus'", "does not exist", "allowed"], False),
    ("s3-without-s3fs", {"input": {"uri": "s3://bucket/c/"}}, ["input.uri", "s3fs", "longdoc[s3]"], False),
    ("gs-without-gcsfs", {"output": {"uri": "gs://bucket/o"}}, ["output.uri", "gcsfs", "longdoc[gcs]"], False),
]

# Raw YAML: mistakes a dict cannot hold.
YAML_CASES = [
    ("duplicate-top", "name: a\ninput: {uri: X}\nname: b\n", ["duplicate key 'name'", "line 3", "each key once"]),
    ("duplicate-nested", "name: a\ninput: {uri: X}\ngeneration:\n  seed: 1\n  seed: 2\n",
     ["duplicate key 'seed'", "line 5", "first on line 4"]),
    ("missing-input", "name: a\n", ["input", "missing", "required"]),
]

# Command-line mistakes on a valid spec: (id, args after `run SPEC`, substrings).
ARG_CASES = [
    ("date-no-dashes", ["--date", "20260131"], ["--date", "'20260131'", "YYYY-MM-DD"]),
    ("date-not-real", ["--date", "2026-02-30"], ["--date", "'2026-02-30'", "YYYY-MM-DD"]),
    ("date-week", ["--date", "2026-W05-6"], ["--date", "'2026-W05-6'", "YYYY-MM-DD"]),
    ("run-id-dots", ["--run-id", "../x"], ["--run-id", "'../x'", "A-Z a-z 0-9 . _ -"]),
    ("run-id-slash", ["--run-id", "a/b"], ["--run-id", "'a/b'", "A-Z a-z 0-9 . _ -"]),
    ("run-id-hidden", ["--run-id", ".hidden"], ["--run-id", "'.hidden'", "no leading '.'"]),
    ("set-no-equals", ["--set", "generation.max_new_tokens"], ["generation.max_new_tokens", "dotted.key=value"]),
    ("set-bad-value", ["--set", "generation.top_p=0"], ["generation.top_p", "got 0", "> 0"]),
    ("failed-fraction", ["--max-failed-fraction", "2"], ["--max-failed-fraction", "2.0", "0 to 1"]),
]


class _Reached(AssertionError):
    """Raised by the spies below: a refusal came too late."""


@pytest.fixture(autouse=True)
def never_reach_ray(monkeypatch):
    import pipeline.ops.submit
    import pipeline.runner

    def reached(*args, **kwargs):
        raise _Reached("the command went past validation: it would start or contact Ray")

    monkeypatch.setattr(pipeline.runner, "run_job", reached)
    monkeypatch.setattr(pipeline.ops.submit, "_client", reached)


@pytest.fixture
def no_fs_extras(monkeypatch):
    # None in sys.modules is Python's own "this import fails" marker: it stands for a
    # machine without the s3/gcs extras, whatever this one has installed.
    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.setitem(sys.modules, "gcsfs", None)


def _refused(args: list[str], expected: list[str]) -> None:
    ray_was_up = ray.is_initialized()  # the session's shared Ray may be up from other tests
    res = runner.invoke(app, args)
    assert not isinstance(res.exception, _Reached), f"{args}: not refused before Ray"
    assert res.exit_code == 2, f"{args}: exit {res.exit_code}\n{res.output}"
    for text in expected:
        assert text in res.output, f"{args}: {text!r} not in:\n{res.output}"
    assert "<root>" not in res.output and "Value error" not in res.output
    assert ray.is_initialized() == ray_was_up


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_bad_spec_is_refused_by_validate_run_and_submit(case, tmp_path, no_fs_extras):
    _, patch, expected, pure = case
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), patch)))
    _refused(["validate", str(spec)], expected)
    _refused(["run", str(spec), "--date", "2026-01-31", "--quiet"], expected)
    if pure:  # machine checks (extras, local paths) belong to the cluster, not the submitter
        _refused(["submit", str(spec), "--address", NO_CLUSTER, "--date", "2026-01-31"], expected)


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_bad_yaml_is_refused(case, tmp_path):
    _, text, expected = case
    spec = tmp_path / "job.yaml"
    spec.write_text(text.replace("X", str(tmp_path)))
    _refused(["validate", str(spec)], expected)
    _refused(["run", str(spec), "--quiet"], expected)


@pytest.mark.parametrize("case", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_bad_command_line_is_refused(case, tmp_path):
    _, args, expected = case
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_base(tmp_path)))
    _refused(["run", str(spec), "--quiet", *args], expected)
    if args[0] in ("--date", "--run-id"):
        _refused(["submit", str(spec), "--address", NO_CLUSTER, *args], expected)


def test_the_valid_base_spec_passes(tmp_path):
    """The control: without its mistake, the base spec validates."""
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_base(tmp_path)))
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 0, res.output
    assert "max_doc_tokens: 200000" in res.output
    # ...and `run` goes on to start Ray (the spy stops it there): the refusals above are real.
    res = runner.invoke(app, ["run", str(spec), "--date", "2026-01-31", "--quiet"])
    assert isinstance(res.exception, _Reached)
