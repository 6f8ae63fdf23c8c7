"""stages/completion.py: a date's completion mark, what decides it and what it names."""

from __future__ import annotations

from pathlib import Path

from schemas.loading import spec_from_dict
from stages.completion import clear_completion, completion_key, read_completion, write_completion
from stages.layout import completion_path, runs_root
from stages.partition import RunRequests

DATE = "2026-06-01"
SHARDS = ["/in/a.jsonl", "/in/b.jsonl"]


def _spec(tmp_path, input_=None, task=None, **generation):
    return spec_from_dict({"name": "c", "input": {"uri": str(tmp_path / "in"), "format": "jsonl", **(input_ or {})},
                           "task": task or {"kind": "summarize"},
                           "generation": {"model": "embedded:smollm2-135m-instruct", **generation},
                           "output": {"uri": str(tmp_path / "out")}})


def test_the_key_changes_with_whatever_changes_the_requests(tmp_path):
    """Another listing, model, budget, instruction, limit, field or task: another key (a
    changed spec makes other requests, so its run is work); the same spec and listing: the
    same key. No listing digest (a store without change stamps): no key, never complete."""
    base = completion_key(_spec(tmp_path), "2-abc")
    assert base == completion_key(_spec(tmp_path), "2-abc")
    others = [
        completion_key(_spec(tmp_path), "3-abd"),
        completion_key(_spec(tmp_path, max_new_tokens=7), "2-abc"),
        completion_key(_spec(tmp_path, model="HuggingFaceTB/SmolLM2-360M-Instruct"), "2-abc"),
        completion_key(_spec(tmp_path, task={"kind": "summarize", "instruction": "In one line."}), "2-abc"),
        completion_key(_spec(tmp_path, task={"kind": "qa", "questions": ["Why?"]}), "2-abc"),
        # Other questions, the same instruction: only spec.task tells the requests apart.
        completion_key(_spec(tmp_path, task={"kind": "qa", "questions": ["How?"]}), "2-abc"),
        completion_key(_spec(tmp_path, input_={"limit": 3}), "2-abc"),
        completion_key(_spec(tmp_path, input_={"text_field": "body"}), "2-abc"),
    ]
    assert len({base, *others}) == 1 + len(others)
    assert completion_key(_spec(tmp_path), None) is None


def test_the_output_schema_version_is_in_the_key(tmp_path, monkeypatch):
    """An upgrade that changes the output schema's version writes other rows for the same
    requests: the date's mark no longer matches, and the next run reads its input again."""
    from stages import completion

    base = completion_key(_spec(tmp_path), "2-abc")
    monkeypatch.setattr(completion, "SCHEMA_VERSION", completion.SCHEMA_VERSION + 1)
    assert completion_key(_spec(tmp_path), "2-abc") not in (None, base)


def test_the_reader_code_is_in_the_key(tmp_path, monkeypatch):
    """An upgrade that changes what a file yields (the reader's code) reads the date again; a
    reader whose code cannot be read (a frozen module) gives no key: every run reads."""
    from stages import completion

    assert "stages.read" in completion.READER_MODULES and len(completion.reader_digest()) == 64
    base = completion_key(_spec(tmp_path), "2-abc")
    monkeypatch.setattr(completion, "reader_digest", lambda: "another reader")
    assert completion_key(_spec(tmp_path), "2-abc") not in (None, base)
    monkeypatch.setattr(completion, "reader_digest", lambda: None)
    assert completion_key(_spec(tmp_path), "2-abc") is None


def test_the_mark_names_its_requests_for_its_key_only(tmp_path):
    """Written beside the output root (a reader of the table never sees it), read back as the
    ``RunRequests`` it was written from (ids, keys, shared ids; the files read whole are the
    listing's unless input.limit); another key, no mark, a torn mark: None."""
    spec, root = _spec(tmp_path), str(tmp_path / "out")
    run = RunRequests(ids={"r1", "r2", "r3"}, keys={("d1", "Summarize."), ("d2", None)},
                      shared=1, shared_examples={"d1": SHARDS})
    assert read_completion(root, DATE, "k1", spec, SHARDS) is None
    write_completion(root, DATE, "k1", run)
    assert completion_path(root, DATE) == f"{runs_root(root)}/_complete/{DATE}.parquet"
    back = read_completion(root, DATE, "k1", spec, SHARDS)
    assert (back.ids, back.keys, back.shared, back.shared_examples) == (run.ids, run.keys, 1, {"d1": SHARDS})
    assert back.files == frozenset(SHARDS)
    limited = _spec(tmp_path, input_={"limit": 2})
    assert read_completion(root, DATE, "k1", limited, SHARDS).files == frozenset()
    assert back.covered is None
    # A limited run's files read (the only ones whose rows its keys may replace) come back too.
    write_completion(root, DATE, "k1", RunRequests(ids={"r1"}, keys={("d1", None)}, covered=frozenset(SHARDS[:1])))
    assert read_completion(root, DATE, "k1", limited, SHARDS).covered == frozenset(SHARDS[:1])
    write_completion(root, DATE, "k1", run)
    assert read_completion(root, DATE, "k2", spec, SHARDS) is None
    assert read_completion(root, DATE, None, spec, SHARDS) is None
    assert not (tmp_path / "out").exists()
    Path(completion_path(root, DATE)).write_bytes(b"PAR1 torn")
    assert read_completion(root, DATE, "k1", spec, SHARDS) is None
    clear_completion(root, DATE)
    clear_completion(root, DATE)  # none there: nothing to do
    assert not Path(completion_path(root, DATE)).exists()
