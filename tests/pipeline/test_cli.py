"""The `longdoc` CLI: validation before Ray, exit codes, run and report."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from schemas.checks import shown

runner = CliRunner()


def test_validate_prints_resolved_spec():
    res = runner.invoke(app, ["validate", "jobs/sample-qa.yaml", "--set", "generation.max_new_tokens=7"])
    assert res.exit_code == 0, res.output
    assert "max_new_tokens: 7" in res.output
    assert "question_field: questions" in res.output
    # The last line says what passed, as a YAML comment: the output is still the spec.
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("# jobs/sample-qa.yaml: valid; the input jobs/sample-qa.jsonl is listed and its first "
                           "records have id, text, questions, answers (truncate shows the model 1024 tokens of 8 "
                           "of the first 8 document(s)"), last
    assert last.endswith("the output out/sample-qa can be written; the models it loads are found on this machine")
    printed = yaml.safe_load(res.output)
    assert printed["generation"]["max_new_tokens"] == 7
    assert printed["task"]["instruction"].startswith("Answer the question")  # the default's text, not null
    skipped = runner.invoke(app, ["validate", "jobs/sample-qa.yaml", "--skip-storage"])
    assert "storage not checked (--skip-storage)" in skipped.output.strip().splitlines()[-1]
    crowded = runner.invoke(app, ["validate", "jobs/sample-qa.yaml", "--skip-storage", "--set", "resources.actors=64"])
    assert crowded.output.strip().splitlines()[-1].startswith("# note: resources.actors 64 on this machine's")


def test_invalid_spec_exits_2_naming_the_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ninput: {uri: /d, format: csv}\ngeneration: {temprature: 1}\n")
    # A real subprocess: the error must come before Ray or any model loads.
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "run", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "input.format" in proc.stderr and "'text', 'jsonl' or 'parquet'" in proc.stderr
    assert "generation.temprature" in proc.stderr
    assert "ray" not in proc.stderr.lower()


def test_bad_date_and_bad_override():
    assert runner.invoke(app, ["run", "jobs/sample-qa.yaml", "--date", "31/01/2026"]).exit_code == 2
    res = runner.invoke(app, ["validate", "jobs/sample-qa.yaml", "--set", "compression.method=zip"])
    assert res.exit_code == 2


def test_run_fails_when_too_many_rows_fail_then_report(tmp_path, tiny_model_dir, ray_session):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "ok.txt").write_text("A short document about lakes.")
    (corpus / "bad.txt").write_bytes(b"\xff\xfe\xfd")
    (corpus / "empty.txt").write_text("")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: cli\ninput: {{uri: {corpus}}}\ngeneration: {{model: {tiny_model_dir}, max_new_tokens: 3}}\n"
        f"output: {{uri: {tmp_path}/out}}\n"
    )
    res = runner.invoke(app, ["run", str(spec), "--date", "2026-02-01", "--quiet", "--max-failed-fraction", "0.5"])
    assert res.exit_code == 1
    assert "documents" in res.output and "2 of 3 rows of 2026-02-01 failed" in res.output
    # ... and why: the errors themselves, most frequent first, and where to see every row.
    assert "1 x read: " in res.output and "is not valid UTF-8" in res.output and "empty.txt is empty" in res.output
    assert f"longdoc report {tmp_path}/out --answers 3" in res.output
    # A rerun skips everything already written but must not hide the failures.
    again = runner.invoke(app, ["run", str(spec), "--date", "2026-02-01", "--quiet"])
    assert again.exit_code == 1 and "2 of 3 rows of 2026-02-01 failed" in again.output
    rep = runner.invoke(app, ["report", f"{tmp_path}/out", "--json"])
    assert rep.exit_code == 0, rep.output
    assert '"rows": 3' in rep.output and '"failed": 2' in rep.output
    assert runner.invoke(app, ["report", f"{tmp_path}/nothing"]).exit_code == 2


def test_version_and_schema():
    import json
    from importlib.metadata import version

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"longdoc {version('longdoc')}"
    res = runner.invoke(app, ["validate", "--schema"])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.output)
    assert {"name", "input", "compression", "generation", "output"} <= set(schema["properties"])
    assert schema["required"] == ["name", "input"]
    assert "max_doc_tokens" in json.dumps(schema)
    assert runner.invoke(app, ["validate"]).exit_code == 2  # neither SPEC nor --schema


def test_validate_checks_the_local_input_for_the_run_date(tmp_path):
    (tmp_path / "2026-01-31").mkdir()
    (tmp_path / "2026-01-31" / "a.txt").write_text("doc")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: d\ninput: {{uri: '{tmp_path}/{{run_date}}'}}\noutput: {{uri: {tmp_path}/out}}\n")
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0  # date unknown: not checked
    res = runner.invoke(app, ["run", str(spec), "--date", "2026-02-01", "--quiet"])
    # The folder as the message shows it (shown(): a long path is cut in the middle).
    assert res.exit_code == 2 and f"{shown(f'{tmp_path}/2026-02-01')} does not exist" in res.output
    # validate --date checks the same folder `run` would list
    res = runner.invoke(app, ["validate", str(spec), "--date", "2026-02-01"])
    assert res.exit_code == 2 and f"{shown(f'{tmp_path}/2026-02-01')} does not exist" in res.output
    res = runner.invoke(app, ["validate", str(spec), "--date", "2026-01-31"])
    assert res.exit_code == 0 and f"the input {tmp_path}/2026-01-31 is listed and its files are found" in res.output


def test_a_relative_input_that_is_not_there_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: d\ninput: {uri: notes}\noutput: {uri: out}\n")
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and f"'notes' does not exist (looked for {shown(str(tmp_path / 'notes'))})" in res.output


def test_a_misspelt_input_path_gets_the_close_name_of_its_folder(tmp_path, monkeypatch):
    """A new user's 'qa.jsnol' was told where it was looked for, not that qa.jsonl lay there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.jsonl").write_text('{"id": "a", "text": "x"}\n')
    spec = tmp_path / "job.yaml"
    spec.write_text("name: d\ninput: {uri: data/qa.jsnol, format: jsonl}\noutput: {uri: out}\n")
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and "'data/qa.jsnol' does not exist (looked for" in res.output
    assert "(did you mean 'data/qa.jsonl'?)" in res.output
    spec.write_text("name: d\ninput: {uri: data/contracts.jsonl, format: jsonl}\noutput: {uri: out}\n")
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2 and "does not exist" in res.output and "did you mean" not in res.output
    # Nor for a pattern (never a name), nor another date's file for a dated uri (the spec would pin it).
    for uri, near in (("data/*.jsonl", "data/x.jsonl"), ("data/{run_date}.jsonl", "data/2026-01-01.jsonl")):
        (tmp_path / near).write_text('{"id": "a", "text": "x"}\n')
        spec.write_text(f"name: d\ninput: {{uri: '{uri}', format: jsonl}}\noutput: {{uri: out}}\n")
        res = runner.invoke(app, ["validate", str(spec), "--date", "2026-01-02"])
        assert res.exit_code == 2 and "does not exist" in res.output and "did you mean" not in res.output, res.output


def test_a_relative_input_beside_a_spec_run_from_elsewhere_is_named_with_the_fix(tmp_path, monkeypatch):
    """A new user ran `longdoc validate ~/work/qa.yaml` from another folder: the message said
    where it looked, not that the input lay beside the spec."""
    (tmp_path / "work" / "data" / "notes").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = tmp_path / "work" / "job.yaml"
    spec.write_text("name: d\ninput: {uri: data/notes}\noutput: {uri: out}\n")
    res = runner.invoke(app, ["validate", str(spec)])
    assert res.exit_code == 2
    assert (f"'data/notes' does not exist (looked for {shown(str(tmp_path / 'elsewhere' / 'data' / 'notes'))}), "
            f"but the spec's folder has it ({shown(str(tmp_path / 'work' / 'data' / 'notes'))}); fix: run longdoc "
            f"from {shown(str(tmp_path / 'work'))}") in res.output


def test_oversized_documents_become_input_error_rows(tmp_path, tiny_model_dir, ray_session):
    from pipeline.report.load import load_output

    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "short.txt").write_text("A short document about lakes.")
    (corpus / "long.txt").write_text("Rivers run to the sea. " * 40)  # ~200 tokens, < 2000 bytes
    (corpus / "huge.txt").write_text("x" * 3000)  # over the byte limit: never tokenized
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: bounded\ninput: {{uri: {corpus}, max_doc_tokens: 50, max_doc_bytes: 2000}}\n"
        f"generation: {{model: {tiny_model_dir}, max_new_tokens: 2}}\noutput: {{uri: {tmp_path}/out}}\n"
    )
    res = runner.invoke(app, ["run", str(spec), "--date", "2026-02-02", "--quiet", "--max-failed-fraction", "1"])
    assert res.exit_code == 0, res.output
    # Under the threshold the failures are still said, with their reasons (not only a count).
    assert "note: 2 row(s) of this run failed; the date's most frequent errors:" in res.output
    assert "input.max_doc_tokens=50" in res.output
    rows = {r["doc_id"]: r for r in load_output(f"{tmp_path}/out").to_pylist()}
    assert rows["short.txt"]["error"] is None
    assert "input.max_doc_tokens=50" in rows["long.txt"]["error"] and "'long.txt'" in rows["long.txt"]["error"]
    assert "input.max_doc_bytes=2000" in rows["huge.txt"]["error"] and "3000 bytes" in rows["huge.txt"]["error"]
    assert rows["long.txt"]["error_kind"] == rows["huge.txt"]["error_kind"] == "input"


def test_the_cli_imports_no_heavy_module():
    """Refusals come in about a second only if the CLI itself loads no torch/Ray/transformers:
    every command module imports them inside its function (a fresh interpreter checks)."""
    code = "import sys, pipeline.cli; print(sorted({'torch', 'ray', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_printed_schema_checks_specs_like_an_editor_would():
    import json

    import jsonschema  # the test extra
    import yaml

    schema = json.loads(runner.invoke(app, ["validate", "--schema"]).output)
    validator = jsonschema.Draft202012Validator(schema)
    for path in ("jobs/sample-qa.yaml", "jobs/sample-summarize.yaml"):
        with open(path) as f:
            assert list(validator.iter_errors(yaml.safe_load(f))) == [], path
    bad = {"name": "x", "input": {"uri": "/d"}, "compression": {"method": "truncate", "keep": "middle"}}
    assert list(validator.iter_errors(bad))
    assert list(validator.iter_errors({"name": "x", "input": {"uri": "/d", "formt": "text"}}))


def test_choice_options_list_their_choices_in_help():
    """--runner and --retry-errors were `<str>` in --help: no listed choices, no completion."""
    import os

    res = runner.invoke(app, ["run", "--help"], env={**os.environ, "COLUMNS": "200"})
    assert res.exit_code == 0
    assert "auto|ray|local" in res.output and "all|retryable|none" in res.output
    bad = runner.invoke(app, ["run", "jobs/sample-qa.yaml", "--runner", "cluster"])
    assert bad.exit_code == 2 and "'cluster' is not one of" in bad.output


def test_a_cluster_address_where_nothing_answers_is_refused_at_once(tmp_path):
    """ray.init waited over ten minutes on such an address before it failed."""
    from ray_head import free_ports

    (port,) = free_ports(1)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: d\ninput: {{uri: '{Path(__file__).resolve().parents[2]}/jobs/corpus'}}\noutput: {{uri: {tmp_path}/out}}\n")
    t0 = time.monotonic()  # its own process, as a user runs it (this one may hold the session's Ray)
    res = subprocess.run([str(Path(sys.executable).parent / "longdoc"), "run", str(spec), "--quiet",
                          "--address", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and f"--address 127.0.0.1:{port}: nothing answers there" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 60
    assert not list(tmp_path.glob("out.runs/*/*.json")), "a refused run left a run record (report would list it)"


def test_every_command_quiets_the_model_stack_before_it_loads_anything(monkeypatch):
    """transformers' "Loading weights" bar and the hub's bars read the environment when they are
    imported: the CLI sets it first (a user's own value stays)."""
    import os

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    assert CliRunner().invoke(app, ["methods"]).exit_code == 0
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def test_validate_names_the_files_a_folder_input_holds_that_its_format_does_not_read(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.md", "b.pdf", "c.pdf"):
        (docs / name).write_text("A document.")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "m", "input": {"uri": str(docs), "format": "text"},
                                    "task": {"kind": "summarize"}, "output": {"uri": str(tmp_path / "out")}}))
    last = runner.invoke(app, ["validate", str(spec)]).output.strip().splitlines()[-1]
    assert "(files it does not read, skipped: 2 .pdf; input.format text reads .txt, .md)" in last
    (docs / "b.pdf").unlink()
    (docs / "c.pdf").unlink()
    assert "skipped" not in runner.invoke(app, ["validate", str(spec)]).output.strip().splitlines()[-1]


# A process installing run's interrupt handlers, then signalled as a test says: it prints
# what the handlers did, and exits 0 unless a handler exited it first.
_SIGNALLED = """
import os, signal, sys, time
from pipeline.cli import _interrupts_raise
from pipeline.runner import RunInterrupted
_interrupts_raise()
gap = float(sys.argv[1])
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
except RunInterrupted:
    print("interrupted", flush=True)
time.sleep(gap)
os.kill(os.getpid(), getattr(signal, sys.argv[2]))
time.sleep(0.5)
print("still running", flush=True)
"""


def test_a_signal_sent_twice_at_once_is_one_stop_a_later_one_exits(tmp_path):
    """pipeline/cli.py ``_interrupts_raise``: GNU ``timeout`` sends SIGTERM to the run and
    then to its process group, so the run got it twice within microseconds and took the
    'again: exiting now' path, ending without its record. A second signal within
    ``SAME_SIGNAL_S`` (0.5 s) is the first one's duplicate; one 1 s later, or another signal
    at once, still exits at once (143)."""
    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "signalled.py"
    script.write_text(_SIGNALLED)
    env = {"PYTHONPATH": repo, "PATH": "/usr/bin:/bin"}
    twice = subprocess.run([sys.executable, str(script), "0", "SIGTERM"], capture_output=True, text=True, env=env,
                           timeout=120)
    # the first sleep (1 s) ends by the exception, so the second signal comes ~0 s after it
    assert twice.returncode == 0, twice.stderr
    assert twice.stdout.split() == ["interrupted", "still", "running"] and "again" not in twice.stderr
    later = subprocess.run([sys.executable, str(script), "1.0", "SIGTERM"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert later.returncode == 143 and "SIGTERM again: exiting now" in later.stderr, (later.stdout, later.stderr)
    # Another signal at once is a second stop, not a duplicate: a supervisor's SIGTERM, then Ctrl-C.
    other = subprocess.run([sys.executable, str(script), "0", "SIGINT"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert other.returncode == 143 and "SIGINT again: exiting now" in other.stderr, (other.stdout, other.stderr)
