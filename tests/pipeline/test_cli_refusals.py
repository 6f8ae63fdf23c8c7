"""Bad specs, command lines and input files are refused before Ray starts, naming the field.

One table per kind of mistake: a spec mistake (a YAML patch over a valid spec, or raw
YAML), a command-line mistake, or an odd file on disk (a FIFO, a device, a folder where
a file belongs, the output aliasing the input). Each case holds the strings its message
must show: the field path (or file, or option), the bad value and what is allowed.
Every spec case goes through `longdoc validate` and `longdoc run` in-process (typer's
CliRunner), the pure ones also through `longdoc submit`. Each must exit 2 without
reaching the code that starts or contacts Ray (``run_job``, the Jobs API client), leave
Ray uninitialised when it was, print no traceback and a bounded message, write nothing
(the case's folder is the same before and after) and answer in under
``MAX_REFUSAL_S`` (the product's contract for a refusal, not a speed benchmark).
Special files that would block or never end a read run in a child process with a hang
guard, and show that the refusing process never imported Ray.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.ops.submit import _client as _REAL_CLIENT  # the real one: the spies below replace it

runner = CliRunner()
NO_CLUSTER = "http://127.0.0.1:9"  # discard port: a refusal must come before any request
#: A refusal answers in under this many seconds (the product's contract for bad input).
MAX_REFUSAL_S = 3.0
#: A refusal's message stays readable: a spec with thousands of mistakes lists a few.
MAX_MESSAGE_CHARS = 10_000
HUGE = 10**30


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
    # Budgets that can never fit the generating model's context (stages/context_budget.py).
    ("budget-truncate", {"compression": {"method": "truncate", "target_tokens": 1000000}},
     ["compression.target_tokens", "got 1000000", "(8192 positions)", "allowed: at most"], True),
    ("budget-finch-chunk", {"compression": {"method": "finch", "target_tokens": 7900}},
     ["compression.target_tokens", "got 7900", "compression.chunk_tokens", "allowed: at most"], True),
    ("budget-max-new", {"generation": {"max_new_tokens": 8192}},
     ["generation.max_new_tokens", "got 8192", "allowed: at most"], True),
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
     ["compression.target_tokens", "'none' takes no target_tokens", "truncate", "finch",
      "fix: remove it (from the command line: --set compression.target_tokens=null)"], True),
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
    # Non-finite numbers: `.inf` CPUs crashed init_ray, an `.inf` price made every row's cost inf.
    ("num-cpus-inf", {"resources": {"num_cpus": math.inf}}, ["resources.num_cpus", "got inf", "a finite number"], True),
    ("cost-inf", {"cost": {"usd_per_device_hour": math.inf}},
     ["cost.usd_per_device_hour", "got inf", "a finite number"], True),
    ("bm25-k1-inf", {"compression": {"method": "bm25", "k1": math.inf}}, ["compression.k1", "got inf", "a finite number"], True),
    ("temperature-nan", {"generation": {"temperature": math.nan}},
     ["generation.temperature", "got nan", "a finite number"], True),
    ("top-p-nan", {"generation": {"top_p": math.nan}}, ["generation.top_p", "got nan", "a finite number"], True),
    ("kv-memory-inf", {"resources": {"kv_memory_gb": math.inf}}, ["resources.kv_memory_gb", "got inf", "finite"], True),
    ("timeout-minus-inf", {"resources": {"schedule_timeout_s": -math.inf}},
     ["resources.schedule_timeout_s", "got -inf", "a finite number"], True),
    # Booleans where a number belongs (pydantic alone reads true as 1).
    ("max-new-true", {"generation": {"max_new_tokens": True}},
     ["generation.max_new_tokens", "got True", "a number (true/false is not one)"], True),
    ("temperature-true", {"generation": {"temperature": True}}, ["generation.temperature", "got True", "a number"], True),
    ("num-cpus-true", {"resources": {"num_cpus": True}}, ["resources.num_cpus", "got True", "a number"], True),
    ("actors-true", {"resources": {"actors": [True, 2]}}, ["resources.actors[0]", "got True", "a number"], True),
    ("seed-false", {"generation": {"seed": False}}, ["generation.seed", "got False", "a number"], True),
    ("decode-slots-true", {"resources": {"decode_slots": True}}, ["resources.decode_slots", "got True", "a number"], True),
    # Huge values: each field's own bounds, else 64 bits (Ray, torch and reads overflow later).
    ("actors-huge", {"resources": {"actors": HUGE}}, ["resources.actors", f"got {HUGE}", "1 to 10000"], True),
    ("actors-huge-max", {"resources": {"actors": [1, HUGE]}}, ["resources.actors", str(HUGE), "<= 10000"], True),
    ("max-retries-huge", {"resources": {"max_retries": HUGE}}, ["resources.max_retries", f"got {HUGE}", "<= 100"], True),
    ("max-doc-bytes-huge", {"input": {"max_doc_bytes": HUGE}},
     ["input.max_doc_bytes", f"got {HUGE}", "<= 2147483648"], True),
    ("limit-huge", {"input": {"limit": HUGE}}, ["input.limit", f"got {HUGE}", "<= 1000000000000"], True),
    ("decode-slots-huge", {"resources": {"decode_slots": HUGE}}, ["resources.decode_slots", "'auto'", "<= 256"], True),
    ("seed-huge", {"generation": {"seed": HUGE}}, ["generation.seed", f"got {HUGE}", "(64 bits)"], True),
    ("seed-huge-negative", {"generation": {"seed": -HUGE}}, ["generation.seed", f"got {-HUGE}", ">= -9223372036854775808"], True),
    ("target-tokens-huge", {"compression": {"method": "bm25", "target_tokens": HUGE}},
     ["compression.target_tokens", f"got {HUGE}", ">= 1, <= 9223372036854775807 (64 bits)"], True),
    ("num-cpus-huge", {"resources": {"num_cpus": HUGE}}, ["resources.num_cpus", f"got {HUGE}", "<= 1024"], True),
    ("kv-memory-huge", {"resources": {"kv_memory_gb": 1e30}}, ["resources.kv_memory_gb", "got 1e+30", "<= 65536"], True),
    ("bm25-k1-huge", {"compression": {"method": "bm25", "k1": 1e30}}, ["compression.k1", "got 1e+30", "<= 1000"], True),
    ("batch-size-float-huge", {"resources": {"batch_size": 1e30}},
     ["resources.batch_size", "got 1e+30", "allowed: an integer, >= 1, <= 100000"], True),
    # Trailing newlines (a `$` in a pattern matches before one).
    ("name-newline", {"name": "refuse\n"}, ["name", "'refuse\\n'", "A-Z a-z 0-9 . _ -"], True),
    ("cudagraphs-on-cpu", {"generation": {"compile": "cudagraphs"}},
     ["generation.compile", "'cudagraphs'", "num_gpus is 0", "allowed on CPU: auto, inductor, off"], True),
    # The output is the input spelled differently: compared as locations, not strings.
    ("output-file-scheme", {"output": {"uri": "file:///data/c"}, "input": {"uri": "/data/c"}},
     ["output.uri", "'file:///data/c'", "allowed: a location outside the input"], True),
    ("output-dotdot", {"output": {"uri": "/data/out/../c"}, "input": {"uri": "/data/c"}},
     ["output.uri", "'/data/out/../c'", "outside the input"], True),
    ("output-dot-slashes", {"output": {"uri": "/data/./c//x/"}, "input": {"uri": "file:///data/c/"}},
     ["output.uri", "'/data/./c//x/'", "outside the input"], True),
    ("output-gcs-alias", {"output": {"uri": "gcs://b/c/out"}, "input": {"uri": "gs://b/c"}},
     ["output.uri", "'gcs://b/c/out'", "outside the input"], True),
    ("qa-field-of-text", {"input": {"question_field": "q"}, "task": {"kind": "qa"}},
     ["input.question_field", "'q'", "format text has no fields", "format jsonl or parquet"], True),
    # Long texts: a prompt part over the cap can never fit; a 5 MB one is refused unread.
    ("instruction-long", {"task": {"instruction": "x" * 150_000}},
     ["task.instruction", "'xxxx", "at most 100000 character(s)"], True),
    ("instruction-5mb", {"task": {"instruction": "x" * 5_000_000}},
     ["job spec", "5000", "bytes; allowed: at most 262144"], True),
]

# Raw YAML: mistakes a dict cannot hold.
YAML_CASES = [
    ("duplicate-top", "name: a\ninput: {uri: X}\nname: b\n", ["duplicate key 'name'", "line 3", "each key once"]),
    ("duplicate-nested", "name: a\ninput: {uri: X}\ngeneration:\n  seed: 1\n  seed: 2\n",
     ["duplicate key 'seed'", "line 5", "first on line 4"]),
    ("missing-input", "name: a\n", ["input", "missing", "required"]),
    ("temperature-yes", "name: a\ninput: {uri: X}\ngeneration: {temperature: yes}\n",
     ["generation.temperature", "got True", "a number (true/false is not one)"]),
    ("max-new-on", "name: a\ninput: {uri: X}\ngeneration: {max_new_tokens: on}\n",
     ["generation.max_new_tokens", "got True", "a number"]),
    ("int-of-5000-digits", "name: a\ninput: {uri: X}\ngeneration: {seed: " + "9" * 5000 + "}\n",
     ["4300 digits", "allowed: numbers of at most 19 digits"]),
    ("nul-byte", "name: a\ninput: {uri: X}\ngeneration: {model: 'emb\x00edded'}\n",
     ["line 3, column 25", "U+0000", "allowed: printable text"]),
    ("control-char", "name: a\x07\ninput: {uri: X}\n", ["line 1, column 8", "U+0007", "allowed: printable text"]),
    # 100k unknown keys took 15 s and printed 11.7 MB: refused by size, unread.
    ("keys-100k", "name: a\ninput: {uri: X}\ngeneration:\n" + "".join(f"  k{i}: {i}\n" for i in range(100_000)),
     ["bytes; allowed: at most 262144"]),
    ("keys-1500", "name: a\ninput: {uri: X}\ngeneration: {" + ", ".join(f"k{i}: 0" for i in range(1500)) + "}\n",
     ["line 3", "a mapping of 1500 keys", "allowed: at most 1000"]),
    ("unknown-keys-900", "name: a\ninput: {uri: X}\ngeneration: {" + ", ".join(f"k{i}: 0" for i in range(900)) + "}\n",
     ["generation.k0", "unknown field 'k0'", "allowed: model", "875 more problem(s) not listed"]),
    # A billion-laughs alias bomb (10**30 leaves) and a self-referencing alias: bounded reprs.
    ("alias-bomb", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 30))
     + "name: a\ninput: {uri: X}\ngeneration: {stop: *a29}\n",
     ["generation.stop[0]", "got [[[[", "allowed: a string", "unknown field 'a0'"]),
    ("alias-cycle", "name: a\ninput: {uri: X}\ngeneration: {stop: &r [*r]}\n",
     ["generation.stop[0]", "got [[[", "allowed: a string"]),
    ("nesting-50k", "name: a\ninput: {uri: X}\ngeneration: {stop: " + "[" * 50_000 + "]" * 50_000 + "}\n",
     ["not valid YAML", "maximum nesting depth", "line 3"]),
    ("tab-indent", "name: a\ninput:\n\turi: X\n", ["not valid YAML", "line 3", "fix: indent with spaces, not tabs"]),
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
    ("failed-fraction-nan", ["--max-failed-fraction", "nan"], ["--max-failed-fraction", "got nan", "0 to 1"]),
    ("run-id-newline", ["--run-id", "abc\n"], ["--run-id", "'abc\\n'", "A-Z a-z 0-9 . _ -"]),
    ("date-newline", ["--date", "2026-01-31\n"], ["--date", "'2026-01-31\\n'", "YYYY-MM-DD"]),
    ("set-list-item", ["--set", "resources.actors.1=8"],
     ["resources.actors.1=8", "'1' is a list position", "allowed: set the whole list", "--set resources.actors="]),
    ("set-list-item-known", ["--set", "resources.actors=[1, 2]", "--set", "resources.actors.1=8"],
     ["'1' is a list position", "now [1, 2]", "e.g. --set resources.actors=[1, 8]"]),
    ("set-true-for-int", ["--set", "generation.max_new_tokens=true"],
     ["generation.max_new_tokens", "got True", "a number"]),
    ("set-inf", ["--set", "resources.num_cpus=.inf"], ["resources.num_cpus", "got inf", "a finite number"]),
    ("set-nul", ["--set", "name=a\x00b"], ["--set", "U+0000", "allowed: printable text"]),
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


def _tree(root: Path) -> dict[str, int]:
    """Every path under ``root`` (links not followed) with its size: what a refusal must not change."""
    return {str(p.relative_to(root)): (p.lstat().st_size if p.is_file() and not p.is_symlink() else -1)
            for p in root.rglob("*")}


def _refused(args: list[str], expected: list[str], root: Path) -> None:
    """Run ``longdoc ARGS`` in-process: exit 2 before Ray, in time, naming ``expected``,
    with no traceback and nothing written under ``root`` (the case's folder)."""
    ray_was_up = ray.is_initialized()  # the session's shared Ray may be up from other tests
    before = _tree(root)
    t0 = time.perf_counter()
    res = runner.invoke(app, args)
    took = time.perf_counter() - t0
    assert not isinstance(res.exception, _Reached), f"{args}: not refused before Ray"
    assert res.exit_code == 2, f"{args}: exit {res.exit_code}\n{res.output[:3000]}"
    for text in expected:
        assert text in res.output, f"{args}: {text!r} not in:\n{res.output[:3000]}"
    assert "<root>" not in res.output and "Value error" not in res.output
    assert "Traceback" not in res.output, res.output[:3000]
    assert len(res.output) <= MAX_MESSAGE_CHARS, f"{args}: a message of {len(res.output)} characters"
    assert ray.is_initialized() == ray_was_up
    assert _tree(root) == before, f"{args}: a refusal wrote or removed files"
    assert took < MAX_REFUSAL_S, f"{args}: refused after {took:.2f} s (allowed: < {MAX_REFUSAL_S} s)"


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_bad_spec_is_refused_by_validate_run_and_submit(case, tmp_path, no_fs_extras):
    _, patch, expected, pure = case
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), patch)))
    _refused(["validate", str(spec)], expected, tmp_path)
    _refused(["run", str(spec), "--date", "2026-01-31", "--quiet"], expected, tmp_path)
    if pure:  # machine checks (extras, local paths) belong to the cluster, not the submitter
        _refused(["submit", str(spec), "--address", NO_CLUSTER, "--date", "2026-01-31"], expected, tmp_path)


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_bad_yaml_is_refused(case, tmp_path):
    _, text, expected = case
    spec = tmp_path / "job.yaml"
    spec.write_text(text.replace("X", str(tmp_path)))
    _refused(["validate", str(spec)], expected, tmp_path)
    _refused(["run", str(spec), "--quiet"], expected, tmp_path)


@pytest.mark.parametrize("case", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_bad_command_line_is_refused(case, tmp_path):
    _, args, expected = case
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_base(tmp_path)))
    _refused(["run", str(spec), "--quiet", *args], expected, tmp_path)
    if args[0] in ("--date", "--run-id", "--max-failed-fraction"):
        _refused(["submit", str(spec), "--address", NO_CLUSTER, *args], expected, tmp_path)


# Operations commands: (id, command and options after SPEC, substrings). The address
# without a scheme was dialled as a GCS for 20 s and more; a render fraction outside 0..1
# was written into the nightly entrypoint, so the cluster run exited 2 every night.
OPS_CASES = [
    ("submit-address-no-scheme", ["submit", "{spec}", "--address", "127.0.0.1:9"],
     ["--address '127.0.0.1:9'", "the Jobs API is the dashboard's URL, e.g. http://127.0.0.1:8265", "allowed: http://HOST:PORT"]),
    ("submit-address-ray-scheme", ["submit", "{spec}", "--address", "ray://127.0.0.1:10001"],
     ["--address 'ray://127.0.0.1:10001'", "allowed: http://HOST:PORT or https://HOST:PORT"]),
    ("status-address-no-scheme", ["status", "some-id", "--address", "127.0.0.1:9"],
     ["--address '127.0.0.1:9'", "allowed: http://HOST:PORT"]),
    ("logs-address-no-scheme", ["logs", "some-id", "--address", "127.0.0.1:9"],
     ["--address '127.0.0.1:9'", "allowed: http://HOST:PORT"]),
    ("render-fraction-2", ["render", "{spec}", "--max-failed-fraction", "2"],
     ["--max-failed-fraction", "got 2.0", "allowed: 0 to 1"]),
    ("render-fraction-nan", ["render", "{spec}", "--max-failed-fraction", "nan"],
     ["--max-failed-fraction", "got nan", "allowed: 0 to 1"]),
    ("render-name-newline", ["render", "{spec}", "--set", 'name="nightly\\n"'],
     ["name", "'nightly\\n'", "path-safe"]),
    ("validate-a-folder", ["validate", "{corpus}"], ["job spec", "corpus' is a folder", "allowed: a YAML file"]),
    ("run-a-folder", ["run", "{corpus}", "--quiet"], ["job spec", "corpus' is a folder", "allowed: a YAML file"]),
]


@pytest.mark.parametrize("case", OPS_CASES, ids=[c[0] for c in OPS_CASES])
def test_bad_operations_option_is_refused_before_any_connection(case, tmp_path, monkeypatch):
    import ray.job_submission

    import pipeline.ops.submit

    def dialled(*args, **kwargs):
        raise _Reached("a Jobs API client was created: the address was dialled")

    # The real address check inside _client runs; only the connection itself is a spy.
    monkeypatch.setattr(pipeline.ops.submit, "_client", _REAL_CLIENT)
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", dialled)
    _, args, expected = case
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_base(tmp_path)))
    args = [a.format(spec=spec, corpus=tmp_path / "corpus") for a in args]
    _refused(args, expected, tmp_path)


# ----------------------------------------------------------------------------- files on disk
def _corpus_with(tmp_path: Path, kind: str) -> tuple[dict, list[str]]:
    """(spec patch, expected substrings) for an input that is an odd file of ``kind``."""
    odd = tmp_path / "odd"
    odd.mkdir()
    if kind == "fifo":
        os.mkfifo(odd / "docs.jsonl")
        return ({"input": {"uri": str(odd / "docs.jsonl"), "format": "jsonl"}},
                ["input.uri", "docs.jsonl' is a FIFO", "allowed: a regular file or a folder"])
    if kind == "fifo-in-folder":
        (odd / "a.txt").write_text("A document.")
        os.mkfifo(odd / "b.txt")
        return ({"input": {"uri": str(odd)}}, ["input.uri", "b.txt' is not a regular file (a FIFO)", "allowed: regular files"])
    if kind == "link-to-dev-zero":
        (odd / "docs.jsonl").symlink_to("/dev/zero")
        return ({"input": {"uri": str(odd / "docs.jsonl"), "format": "jsonl"}},
                ["input.uri", "docs.jsonl' is a character device", "allowed: a regular file or a folder"])
    if kind == "link-to-dev-zero-in-folder":
        (odd / "a.jsonl").write_text('{"id": "a", "text": "A document."}\n')
        (odd / "z.jsonl").symlink_to("/dev/zero")
        return ({"input": {"uri": str(odd), "format": "jsonl"}},
                ["input.uri", "z.jsonl' is not a regular file (a character device)", "allowed: regular files"])
    if kind == "dev-zero":
        return ({"input": {"uri": "/dev/zero"}}, ["input.uri", "'/dev/zero' is a character device", "allowed"])
    raise AssertionError(kind)


#: A child `longdoc` whose run_job is a spy (exit 99), reporting at exit whether Ray was imported.
_CHILD = """
import sys
import pipeline.runner
def reached(*args, **kwargs):
    print("REACHED run_job: not refused before Ray", flush=True)
    raise SystemExit(99)
pipeline.runner.run_job = reached
from pipeline.cli import app
try:
    app(sys.argv[1:], prog_name="longdoc")
finally:
    print("ray imported: " + str("ray" in sys.modules), file=sys.stderr)
"""
#: The hang guard: a child that blocks on a FIFO or reads /dev/zero is killed after this.
HANG_GUARD_S = 60


def _refused_in_child(args: list[str], expected: list[str], root: Path) -> None:
    """Like ``_refused``, in a fresh process (the latency a user sees, imports included)
    that is killed if it hangs; Ray must not even be imported."""
    before = _tree(root)
    t0 = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                             timeout=HANG_GUARD_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args}: still running after {HANG_GUARD_S} s: the input was read, not refused")
    took = time.perf_counter() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 2, f"{args}: exit {res.returncode}\n{out[:3000]}"
    for text in expected:
        assert text in out, f"{args}: {text!r} not in:\n{out[:3000]}"
    assert "Traceback" not in out and "REACHED" not in out, out[:3000]
    assert "ray imported: False" in out, out[:3000]
    assert _tree(root) == before, f"{args}: a refusal wrote or removed files"
    assert took < MAX_REFUSAL_S, f"{args}: refused after {took:.2f} s in a fresh process (allowed: < {MAX_REFUSAL_S} s)"


SPECIAL_INPUTS = ["fifo", "fifo-in-folder", "link-to-dev-zero", "link-to-dev-zero-in-folder", "dev-zero"]


@pytest.mark.parametrize("kind", SPECIAL_INPUTS)
def test_an_input_that_would_block_or_never_end_is_refused(kind, tmp_path):
    """A FIFO blocks a reader for ever and /dev/zero never ends: both passed `validate`
    and hung `run`. Refused by validate and run, each in a fresh process (~1 s each)."""
    patch, expected = _corpus_with(tmp_path, kind)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), patch)))
    _refused_in_child(["validate", str(spec)], expected, tmp_path)
    _refused_in_child(["run", str(spec), "--quiet", "--date", "2026-01-31"], expected, tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-to-dev-zero"])
def test_a_spec_that_is_not_a_regular_file_is_refused(kind, tmp_path):
    if kind == "fifo":
        spec, what = tmp_path / "job.yaml", "is a FIFO (named pipe)"
        os.mkfifo(spec)
    elif kind == "dev-zero":
        spec, what = Path("/dev/zero"), "is a character device"
    else:
        spec, what = tmp_path / "job.yaml", "is a character device"
        spec.symlink_to("/dev/zero")
    _refused_in_child(["validate", str(spec)], ["job spec", what, "allowed: a regular YAML file"], tmp_path)


def test_a_folder_named_like_a_file_is_refused_before_ray(tmp_path):
    """An input folder named `x.jsonl` (no .jsonl file inside) passed validate, and `run`
    refused it only after importing Ray (5-8 s)."""
    (tmp_path / "x.jsonl").mkdir()
    (tmp_path / "x.jsonl" / "notes.txt").write_text("not JSONL")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), {"input": {"uri": str(tmp_path / "x.jsonl"),
                                                                      "format": "jsonl"}})))
    expected = ["input.uri", "x.jsonl' has no jsonl files", "looked for .jsonl, .json"]
    _refused(["validate", str(spec)], expected, tmp_path)
    _refused(["run", str(spec), "--quiet"], expected, tmp_path)


def test_an_output_that_is_the_input_through_a_symlink_is_refused(tmp_path):
    """Only this machine knows that `out` links into the corpus: a machine check of run and validate."""
    _base(tmp_path)
    (tmp_path / "out").symlink_to(tmp_path / "corpus")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), {"output": {"uri": str(tmp_path / "out" / "results")}})))
    expected = ["output.uri", "resolves to", "through a symlink", "allowed: a location outside the input"]
    _refused(["validate", str(spec)], expected, tmp_path)
    _refused(["run", str(spec), "--quiet"], expected, tmp_path)


def test_an_input_uri_with_a_trailing_newline_is_refused(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(_merge(_base(tmp_path), {"input": {"uri": f"{tmp_path / 'corpus'}\n"}})))
    expected = ["input.uri", "corpus\\n' does not exist", "allowed: an existing file or folder"]
    _refused(["validate", str(spec)], expected, tmp_path)
    _refused(["run", str(spec), "--quiet"], expected, tmp_path)


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


def test_documents_too_long_for_method_none_are_refused(tmp_path, tokenizer):
    # tokenizer: the embedded model's tokenizer files exist (the check reads them, not the model)
    corpus = tmp_path / "long"
    corpus.mkdir()
    (corpus / "report.txt").write_text("The board approved the budget of the plant. " * 1500)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "long", "input": {"uri": str(corpus)},
                                    "output": {"uri": str(tmp_path / "out")}}))
    expected = ["compression.method: 'none' reads each document whole", "document 'report.txt' needs",
                "more than the model's context of 8192", "use compression.method truncate"]
    for command in ("validate", "run"):
        _refused([command, str(spec)], expected, tmp_path)
