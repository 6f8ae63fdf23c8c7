"""Job spec validation: defaults, strictness, overrides and error messages."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from schemas.loading import SpecError, apply_overrides, load_spec, spec_from_dict
from schemas.spec import EMBEDDED_MODEL, JobSpec

MINIMAL = {"name": "nightly", "input": {"uri": "s3://bucket/docs/{run_date}/"}}


def test_minimal_spec_gets_defaults():
    spec = spec_from_dict(MINIMAL)
    assert spec.generation.model == EMBEDDED_MODEL
    assert spec.compression.method == "none"
    assert spec.task.kind == "summarize"
    assert "summary of the document" in spec.task.resolved_instruction
    assert spec.generation.temperature == 0.0


def test_spec_is_frozen():
    spec = spec_from_dict(MINIMAL)
    with pytest.raises(ValidationError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "patch, path_in_message",
    [
        ({"generation": {"max_new_tokens": 0}}, "generation.max_new_tokens"),
        ({"input": {"uri": "x", "format": "csv"}}, "input.format"),
        ({"compression": {"method": "zip"}}, "compression"),
        ({"compression": {"method": "truncate", "keep": "middle"}}, "compression.keep"),
        ({"generation": {"temprature": 0.5}}, "generation.temprature"),
        ({"resources": {"actors": [3, 1]}}, "resources.actors"),
        ({"resources": {"num_cpus": "all"}}, "resources.num_cpus"),
        ({"resources": {"num_cpus": 0}}, "resources.num_cpus"),
        ({"generation": {"speculative": {"min_ngram": 4, "max_ngram": 2}}}, "generation.speculative"),
        ({"name": "has space"}, "name"),
        # {job} becomes a folder: a leading '.' hides it, and ".." would climb out of the root
        ({"name": ".hidden"}, "name"),
        ({"name": ".."}, "name"),
        ({"generation": {"compile": "cudagraphs"}}, "generation.compile"),  # no GPU by default
        # an empty question_field names no field: qa then has no questions at all
        ({"task": {"kind": "qa"}, "input": {"uri": "x", "format": "jsonl", "question_field": ""}}, "task.questions"),
        ({"task": {"kind": "qa", "questions": ["Who?"]}, "input": {"uri": "x", "format": "jsonl", "answer_field": "a"}},
         "input.answer_field: 'a' pairs answers with the questions of input.question_field"),
        ({"input": {"uri": "x", "format": "jsonl", "answer_field": "a"}},
         "input.answer_field: got 'a', but task.kind summarize reads no questions or answers"),
    ],
)
def test_bad_values_name_the_field(patch, path_in_message):
    data = {**MINIMAL, **patch}
    with pytest.raises(SpecError) as e:
        spec_from_dict(data, source="job.yaml")
    assert path_in_message in str(e.value)
    assert "job.yaml" in str(e.value)


@pytest.mark.parametrize("uri", ["s3://results", "gs://results/", "/", "."])
def test_an_output_root_without_a_parent_folder_is_refused(uri):
    """The run records go in the output root's sibling ``{uri}.runs/``: a bucket or a
    filesystem root has none in the same place."""
    with pytest.raises(SpecError, match=r"output\.uri.*names no folder with a parent"):
        spec_from_dict({**MINIMAL, "output": {"uri": uri}})
    assert spec_from_dict({**MINIMAL, "output": {"uri": f"{uri.rstrip('/')}/longdoc/{{job}}"}})


def test_num_cpus_auto_resolves_from_the_machine_it_is_given():
    """resources.num_cpus: ``auto`` by default; a number as written (pipeline/runner.py
    ``with_actor_cpus`` hands it the machine)."""
    res = spec_from_dict(MINIMAL).resources
    assert res.num_cpus == "auto"
    assert res.cpus_per_actor(8, 1) == 8 and res.cpus_per_actor(8, 3) == 2 and res.cpus_per_actor(2, 4) == 1
    assert res.cpus_per_actor(None, 1) == 1  # a Ray cluster: its nodes are not this machine
    two = spec_from_dict({**MINIMAL, "resources": {"num_cpus": 2.5, "actors": [1, 3]}}).resources
    assert two.cpus_per_actor(8, 3) == 2.5 and two.cpus_per_actor(None, 3) == 2.5 and two.max_actors == 3


def test_unknown_method_lists_allowed_methods():
    with pytest.raises(SpecError) as e:
        spec_from_dict({**MINIMAL, "compression": {"method": "zip"}})
    for allowed in ("none", "truncate", "finch", "rag", "autocompressor"):
        assert allowed in str(e.value)


def test_a_setting_set_to_null_that_the_method_does_not_take_is_no_setting(tmp_path):
    """A spec written for one method switches to another from the command line: `--set
    compression.method=none` refused the file's target_tokens, and `=null` did not help."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "compression": {"method": "truncate", "target_tokens": 512}}))
    spec = load_spec(str(path), ["compression.method=none", "compression.target_tokens=null"])
    assert spec.compression.method == "none"
    with pytest.raises(SpecError, match="--set compression.target_tokens=null"):  # set here: named
        load_spec(str(path), ["compression.method=none", "compression.target_tokens=512"])
    with pytest.raises(SpecError, match="unknown field 'chunk'"):  # a misspelt setting still is one
        spec_from_dict({**MINIMAL, "compression": {"method": "truncate", "chunk": 3}})


def test_qa_needs_questions():
    with pytest.raises(SpecError, match="question"):
        spec_from_dict({**MINIMAL, "task": {"kind": "qa"}})
    ok = spec_from_dict({**MINIMAL, "task": {"kind": "qa", "questions": ["Who?"]}})
    assert ok.task.questions == ("Who?",)
    from schemas.spec import DEFAULT_QA_INSTRUCTION

    assert ok.task.resolved_instruction == DEFAULT_QA_INSTRUCTION  # not the summary's


@pytest.mark.parametrize(
    ("kind", "method", "mode", "on"),
    [
        ("qa", "truncate", "auto", True),  # questions on one document share its prompt prefix
        ("qa", "none", "auto", True),
        ("qa", "rag", "auto", False),  # the kept context depends on the question
        ("qa", "finch", "auto", False),  # its own prefill
        ("summarize", "truncate", "auto", False),  # one prompt per document
        ("summarize", "truncate", "on", True),
        ("qa", "truncate", "off", False),
    ],
)
def test_prefix_cache_resolves_by_task_and_method(kind, method, mode, on):
    task = {"kind": "qa", "questions": ["Who?", "When?"]} if kind == "qa" else {"kind": kind}
    spec = spec_from_dict({**MINIMAL, "task": task, "compression": {"method": method},
                           "generation": {"prefix_cache": mode}})
    assert spec.reuses_document_prefix is on


def test_prefix_cache_on_needs_a_method_sharing_the_documents_prefix(tmp_path):
    with pytest.raises(SpecError) as e:
        spec_from_dict({**MINIMAL, "compression": {"method": "rag"}, "generation": {"prefix_cache": "on"}})
    msg = str(e.value)
    assert "generation.prefix_cache" in msg and "rag" in msg and "none or truncate" in msg
    # YAML 1.1 reads unquoted on/off as booleans: they still mean on/off.
    p = tmp_path / "j.yaml"
    p.write_text("name: j\ninput: {uri: /data}\ngeneration: {prefix_cache: off}\n")
    assert load_spec(p).generation.prefix_cache == "off"
    assert load_spec(p, ["generation.prefix_cache=on"]).generation.prefix_cache == "on"


def test_overrides_are_parsed_as_yaml_and_validated(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("name: j\ninput: {uri: /data}\n")
    spec = load_spec(p, ["generation.max_new_tokens=64", "resources.actors=[1, 4]", "compression.method=truncate"])
    assert spec.generation.max_new_tokens == 64
    assert spec.resources.actors == (1, 4)
    assert spec.compression.method == "truncate"
    with pytest.raises(SpecError, match="generation.max_new_tokens") as refused:
        load_spec(p, ["generation.max_new_tokens=-3"])
    # the heading says the overrides were part of it (a typo there is not the file's)
    assert str(refused.value).startswith(f"invalid job spec {p} with --set generation.max_new_tokens=-3:")
    with pytest.raises(SpecError, match="dotted.key=value"):
        load_spec(p, ["generation.max_new_tokens"])



def test_compile_off_unquoted_is_off_not_a_boolean(tmp_path):
    # YAML 1.1 reads `off` as false: the spec and --set both mean the choice "off".
    p = tmp_path / "job.yaml"
    p.write_text("name: j\ninput: {uri: /data}\ngeneration: {compile: off}\n")
    assert load_spec(p).generation.compile == "off"
    assert load_spec(p, ["generation.compile=off"]).generation.compile == "off"
    with pytest.raises(SpecError, match="generation.compile"):
        load_spec(p, ["generation.compile=yes"])  # true: no choice reads as it

def test_override_into_a_value_is_an_error():
    with pytest.raises(SpecError, match="is a value"):
        apply_overrides({"name": "x"}, ["name.first=1"])


def test_missing_and_non_mapping_files(tmp_path):
    with pytest.raises(SpecError, match=f"not found \\(looked for '{tmp_path}/nope.yaml'\\); fix: give its path"):
        load_spec(tmp_path / "nope.yaml")
    # A quoted ~ is no home folder (a shell expands it): the path named is the one looked for.
    with pytest.raises(SpecError, match="looked for '/.*/~/nope.yaml'"):
        load_spec("~/nope.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(p)


def test_an_empty_or_non_utf8_spec_says_what_it_is_and_the_fix(tmp_path):
    """An empty spec was told only "must be a YAML mapping", a UTF-16 one "is not UTF-8 text
    (byte 0)": neither said what to do."""
    p = tmp_path / "job.yaml"
    for text, what in [("", "it is empty"), ("# only a comment\n", "it is empty"), ("- a\n", "it is a list"),
                       ("just words\n", "it is a single value")]:
        p.write_text(text)
        with pytest.raises(SpecError, match=f"must be a YAML mapping at the top level .*, and {what}; fix: start from"):
            load_spec(p)
    p.write_bytes("name: a\n".encode("utf-16"))
    with pytest.raises(SpecError, match=r"is not UTF-8 text \(byte 0\); it is UTF-16; fix: .*iconv -f utf-16"):
        load_spec(p)
    p.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError, match=r"is not UTF-8 text \(byte 9\); fix: save it as UTF-8"):
        load_spec(p)


def test_a_yaml_syntax_error_is_one_line_naming_its_line_and_the_fix(tmp_path):
    """PyYAML's four-line message ("while parsing a flow sequence ... did not find expected
    ',' or ']'") was printed as it is, with no fix."""
    p = tmp_path / "job.yaml"
    p.write_text("name: a\ninput: [uri: docs.jsonl\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "\n" not in str(e.value) and "is not valid YAML: while parsing a flow sequence" in str(e.value)
    assert "line 2, column 8 did not find expected ',' or ']'" in str(e.value)
    assert str(e.value).endswith("fix: correct the YAML at the line named (close brackets and quotes; quote a "
                                 "value holding ': ' or ' #')")
    p.write_text("name: a\n")
    with pytest.raises(SpecError) as e:
        load_spec(p, ["generation.max_new_tokens=[1, 2"])
    assert "\n" not in str(e.value) and "value is not valid YAML (while parsing a flow sequence" in str(e.value)
    assert "fix: quote it" in str(e.value)


@pytest.mark.parametrize("text", ["name: a\ninput:\n  uri: qa.jsonl\n   format: jsonl\n",
                                  "name: a\ninput:\n  uri: qa.jsonl\n format: jsonl\n"])
def test_a_field_indented_off_its_section_is_told_to_line_up(text, tmp_path):
    """A field one space off its section's indentation got "mapping values are not allowed"
    and a fix about brackets and quotes."""
    p = tmp_path / "job.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "line 4" in str(e.value)
    assert str(e.value).endswith("fix: indent the fields of one section by the same number of spaces as the line "
                                 "above the one named, and quote a value holding ': ' or ' #'")


def test_a_placeholder_unquoted_in_a_braced_section_is_told_to_quote_it(tmp_path):
    """`output: {uri: out/{job}}`, in the braced style the spec sketch uses for resources,
    ends the section at {job}'s brace; the fix spoke of closing brackets."""
    p = tmp_path / "job.yaml"
    p.write_text("name: a\ninput: {uri: docs, format: text}\noutput: {uri: out/{job}}\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "line 3" in str(e.value)
    assert str(e.value).endswith("fix: quote a value holding {job} or {run_date} inside a { } section "
                                 "({uri: 'out/{job}'})")
    p.write_text("name: a\ninput: {uri: docs, format: text}\noutput: {uri: 'out/{job}'}\n")
    assert load_spec(p).output.uri == "out/{job}"
    # A quoted placeholder is no cause: an unclosed section elsewhere gets the general fix.
    p.write_text("name: a\ninput: {uri: docs, format: text}\noutput: {uri: 'out/{job}'}\n"
                 "resources: {num_cpus: 2\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "quote a value holding {job}" not in str(e.value) and "close brackets and quotes" in str(e.value)


def test_an_unquoted_value_holding_a_colon_is_told_to_quote_it_not_to_indent(tmp_path):
    """`instruction: Answer: briefly` reads as "mapping values are not allowed", the words an
    indentation slip gives; the fix named the indentation first."""
    p = tmp_path / "job.yaml"
    p.write_text("name: a\ninput: {uri: docs, format: text}\ntask:\n  instruction: Answer: briefly\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert str(e.value).endswith("fix: quote the value holding ': ' on the line named (instruction: 'Answer: briefly')")
    # A line of a braced section holds ': ' twice too: indented off, it is told to line up.
    p.write_text("name: a\ninput: {uri: docs, format: text}\n  output: {uri: out}\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "fix: indent the fields of one section" in str(e.value), str(e.value)


def test_json_round_trip():
    spec = spec_from_dict({**MINIMAL, "compression": {"method": "truncate", "target_tokens": 256}})
    again = JobSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec


def test_yaml_merge_keys_may_be_overridden_but_keys_not_repeated():
    from schemas.loading import parse_yaml

    merged = parse_yaml("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert merged["c"] == {"x": 3, "y": 2}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        parse_yaml("c:\n  x: 1\n  x: 2\n")


def test_run_values_that_become_paths():
    from schemas.loading import check_run_date, check_run_id

    assert check_run_date("2024-02-29") == "2024-02-29"
    assert check_run_id("20260131T000000Z-ab12.retry_1") == "20260131T000000Z-ab12.retry_1"
    for bad in ("2023-02-29", "2026-1-31", "2026-01-31T00:00", " 2026-01-31"):
        with pytest.raises(SpecError, match="YYYY-MM-DD"):
            check_run_date(bad)
    for bad in ("", "a b", "x/..", "a..b", ".x", "x" * 129, "é"):
        with pytest.raises(SpecError, match="--run-id"):
            check_run_id(bad)


def test_switching_methods_on_the_command_line_drops_the_files_settings_the_new_one_does_not_take(tmp_path):
    """A summaries spec (truncate, keep head_tail) tried with other methods: `--set
    compression.method=select` was refused for keep 'head_tail', none for target_tokens."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "compression": {"method": "truncate", "target_tokens": 512,
                                                                "keep": "head_tail"}}))
    select = load_spec(str(path), ["compression.method=select"]).compression
    assert select.method == "select" and select.target_tokens == 512 and select.keep == "auto"
    assert load_spec(str(path), ["compression.method=none"]).compression.method == "none"
    tail = load_spec(str(path), ["compression.method=truncate", "compression.keep=tail"]).compression
    assert tail.keep == "tail"  # the same method: nothing dropped, the override applies
    with pytest.raises(SpecError, match="compression.keep"):  # the command line's own mistake is named
        load_spec(str(path), ["compression.method=select", "compression.keep=head_tail"])


@pytest.mark.parametrize("field", ["input", "output"])
def test_credentials_written_into_a_uri_are_refused_and_never_echoed(field):
    """A review's `s3://KEY:SECRET@bucket/...` was accepted (s3fs cannot use it), then printed
    in errors, in a rendered ConfigMap and in a submitted entrypoint."""
    uri = "s3://AKIAURIFAKE0KEY00001:UriSecretFAKE000000000000000secret@docs/in/{job}"
    with pytest.raises(SpecError) as e:
        spec_from_dict({**MINIMAL, field: {**MINIMAL.get(field, {}), "uri": uri}})
    said = str(e.value)
    assert f"{field}.uri" in said and "holds credentials before '@' (s3://***@docs/in/" in said, said
    assert "AKIAURIFAKE" not in said and "UriSecret" not in said

    # ... nor repeated by the heading that names the overrides (a review's refused
    # `--set input.storage_options={key: ..., secret: ...}` was)
    from schemas.loading import _shown_override

    assert _shown_override(f"{field}.uri={uri}") == f"{field}.uri=***"  # it says "Secret"
    assert _shown_override(f"{field}.uri=s3://AKIA1:pw9@docs/x") == f"{field}.uri=s3://***@docs/x"
    # An AWS secret is base64: about half hold a '/' (a review's slipped through)
    slash = "s3://AKIAFAKE0000:wJalrXUtnFEMI/K7MDENG/bPxRfiCYFAKE@docs/in/"
    with pytest.raises(SpecError, match="holds credentials") as e:
        spec_from_dict({**MINIMAL, field: {**MINIMAL.get(field, {}), "uri": slash + "{job}"}})
    assert "K7MDENG" not in str(e.value)
    assert _shown_override(f"{field}.uri={slash}") == f"{field}.uri=s3://***@docs/in/"
    for fine in ("s3://bucket/path@v2/x", "s3://bucket/a:b@c/x", "/tmp/a:b@c/x", "file:///tmp/x:y@z/x"):
        assert spec_from_dict({**MINIMAL, field: {**MINIMAL.get(field, {}), "uri": fine}})  # no credentials there
    assert _shown_override("input.storage_options={key: AKIA0, secret: S3cr3t}") == "input.storage_options=***"
    assert _shown_override("generation.max_new_tokens=64") == "generation.max_new_tokens=64"
