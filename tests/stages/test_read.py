"""Readers: every format, local and memory:// URIs, bad inputs as error documents."""

from __future__ import annotations

import json
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.loading import spec_from_dict
from schemas.spec import InputSpec
from stages.listing import list_shards, skipped_suffixes
from stages.read import read_shard
from stages.requests import expand_requests, generation_fingerprint


def _read_all(inp: InputSpec, date: str = "2026-01-01"):
    uri = inp.uri.replace("{run_date}", date)
    return [d for s in list_shards(inp, date) for d in read_shard(s, inp, uri)]


def test_text_folder_local(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha doc")
    (tmp_path / "sub" / "b.md").write_text("# beta")
    (tmp_path / "skip.json").write_text("{}")
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    (tmp_path / "empty.txt").write_text("  \n")
    docs = {d.doc_id: d for d in _read_all(InputSpec(uri=str(tmp_path), format="text"))}
    assert set(docs) == {"a.txt", "sub/b.md", "bad.txt", "empty.txt"}
    assert docs["a.txt"].text == "alpha doc" and docs["a.txt"].error is None
    assert "not valid UTF-8" in docs["bad.txt"].error and "bad.txt" in docs["bad.txt"].error
    assert "empty" in docs["empty.txt"].error


def test_jsonl_memory_fs_with_bad_lines():
    root = f"memory://corpus-{uuid.uuid4().hex}"
    lines = [
        json.dumps({"id": "d1", "text": "one", "questions": ["q1", "q2"], "answers": ["a1", "a2"]}),
        "{not json",
        json.dumps({"id": "d3"}),
        json.dumps({"id": "d4", "text": "four", "questions": "single q"}),
        "",
    ]
    with fsspec.open(f"{root}/{{run_date}}/part.jsonl".replace("{run_date}", "2026-01-01"), "w") as f:
        f.write("\n".join(lines))
    inp = InputSpec(uri=root + "/{run_date}", format="jsonl", question_field="questions", answer_field="answers")
    docs = _read_all(inp)
    assert len(docs) == 4
    assert docs[0].questions == ["q1", "q2"] and docs[0].answers == ["a1", "a2"]
    assert "part.jsonl:2" in docs[1].error and "not valid JSON" in docs[1].error
    assert "part.jsonl:3" in docs[2].error and "field 'text' is missing" in docs[2].error
    assert docs[3].questions == ["single q"]


def test_parquet_file_and_missing_field(tmp_path):
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"doc": ["x", "y"], "body": ["text x", None]}), path)
    inp = InputSpec(uri=str(path), format="parquet", id_field="doc", text_field="body")
    docs = _read_all(inp)
    assert [d.doc_id for d in docs] == ["x", "y"]
    assert docs[0].text == "text x"
    assert "row1" in docs[1].error and "field 'body' is null" in docs[1].error  # there, and null


def test_a_record_whose_text_is_unusable_keeps_a_row_per_question(tmp_path):
    """Its questions are readable: each gets its own error row, matched by its prompt."""
    p = tmp_path / "d.jsonl"
    recs = [{"id": "empty", "text": " ", "q": ["Who?", "When?"], "a": ["x", None]},
            {"id": "num", "text": 7, "q": "Why?"}, {"text": "no id", "q": ["How?"]}]
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    spec = spec_from_dict({"name": "qa", "task": {"kind": "qa"},
                           "input": {"uri": str(p), "format": "jsonl", "question_field": "q", "answer_field": "a"}})
    docs = read_shard(str(p), spec.input, str(p))
    rows = [r for d in docs for r in expand_requests(d, spec, "r", "2026-01-01", generation_fingerprint(spec))]
    assert [(r["doc_id"], r["prompt"], r["reference"]) for r in rows] == [
        ("empty", "Who?", "x"), ("empty", "When?", None), ("num", "Why?", None), (f"{p}:3", "How?", None)]
    assert all(r["error_kind"] == "input" and r["text"] is None for r in rows)
    assert "field 'text' is empty" in rows[0]["error"] and "is not a string" in rows[2]["error"]
    assert "field 'id' is missing" in rows[3]["error"]
    assert len({r["request_id"] for r in rows}) == 4


# ----------------------------------------------------------------------------- bounded, streamed
def test_iter_lines_matches_split_for_any_block_size():
    import io
    import random

    from stages.read import iter_lines

    rng = random.Random(0)
    lines = [bytes(rng.choice(b"ab{}\"") for _ in range(rng.randrange(0, 40))) for _ in range(200)]
    data = b"\n".join(lines)
    for block in (1, 2, 7, 64, 10_000):
        got = list(iter_lines(io.BytesIO(data), limit=30, block=block))
        assert [n for n, _, _ in got] == list(range(1, len(got) + 1))
        want = list(lines)
        if not want[-1]:
            want = want[:-1]  # a trailing empty line is no line
        assert [raw if raw is not None else len(want[i]) for i, (_, raw, _) in enumerate(got)] == [
            ln if len(ln) <= 30 else len(ln) for ln in want
        ]
        assert [size for _, _, size in got] == [len(ln) for ln in want]


def test_iter_lines_never_holds_an_over_long_line():
    from stages.read import iter_lines

    class Source:
        """A 10 MB single line followed by a short one, served in blocks; records what is held."""

        def __init__(self):
            self.left, self.tail = 10_000_000, b"\n{\"id\": 1}\n"

        def read(self, n):
            if self.left:
                k = min(n, self.left)
                self.left -= k
                return b"x" * k
            out, self.tail = self.tail, b""
            return out

    got = list(iter_lines(Source(), limit=1000, block=4096))
    assert got == [(1, None, 10_000_000), (2, b'{"id": 1}', 9)]


def test_oversized_documents_become_input_errors_naming_the_limit(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "small.txt").write_text("small")
    (tmp_path / "t" / "big.txt").write_text("x" * 200)
    docs = {d.doc_id: d for d in _read_all(InputSpec(uri=str(tmp_path / "t"), max_doc_bytes=100))}
    assert docs["small.txt"].error is None
    assert "200 bytes" in docs["big.txt"].error and "input.max_doc_bytes=100" in docs["big.txt"].error
    assert docs["big.txt"].error_kind == "input"

    lines = [json.dumps({"id": "a", "text": "ok"}), json.dumps({"id": "b", "text": "y" * 300}),
             json.dumps({"id": "c", "text": "fine"})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    jdocs = _read_all(InputSpec(uri=str(tmp_path / "d.jsonl"), format="jsonl", max_doc_bytes=100))
    assert [d.doc_id for d in jdocs] == ["a", f"{tmp_path}/d.jsonl:2", "c"]
    assert "input.max_doc_bytes=100" in jdocs[1].error and jdocs[1].error_kind == "input"
    assert jdocs[2].text == "fine"

    # Parquet: several row groups streamed in batches, row numbers continue across them.
    n = 150
    texts = [f"t{i}" if i != 120 else "é" * 60 for i in range(n)]  # 120 bytes in 60 chars
    pq.write_table(pa.table({"id": [str(i) for i in range(n)], "text": texts, "blob": [b"z"] * n}),
                   tmp_path / "p.parquet", row_group_size=40)
    pdocs = _read_all(InputSpec(uri=str(tmp_path / "p.parquet"), format="parquet", max_doc_bytes=100))
    assert [d.doc_id for d in pdocs] == [str(i) for i in range(n)]
    assert "row120" in pdocs[120].error and "120 bytes" in pdocs[120].error
    assert all(d.error is None for i, d in enumerate(pdocs) if i != 120)


def test_broken_files_error_kinds(tmp_path):
    from stages.read import iter_shard

    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    inp = InputSpec(uri=str(tmp_path / "bad.parquet"), format="parquet")
    (doc,) = _read_all(inp)
    assert "not a readable Parquet file" in doc.error and doc.error_kind == "input"
    # A file gone between listing and reading: storage, a rerun may succeed.
    (gone,) = list(iter_shard(str(tmp_path / "gone.txt"), InputSpec(uri=str(tmp_path)), str(tmp_path)))
    assert gone.doc_id == str(tmp_path / "gone.txt") and gone.error_kind == "retryable"
    assert f"{tmp_path / 'gone.txt'} vanished after the input was listed" in gone.error


def test_streamed_reads_from_s3(monkeypatch):
    """The same limits and streaming over a real S3-compatible server (s3fs buffered files)."""
    import s3fs
    from s3_server import moto_s3

    with moto_s3() as server:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        s3fs.S3FileSystem.clear_instance_cache()
        fs = server.filesystem()
        # moto keeps buckets per process: a bucket name of its own, so another test's
        # "corpus" bucket (tests/pipeline/test_storage_s3.py) does not collide.
        fs.mkdir("read-corpus")
        lines = [json.dumps({"id": "a", "text": "ok"}), json.dumps({"id": "b", "text": "y" * 5000}),
                 json.dumps({"id": "c", "text": "fine"})]
        fs.pipe("read-corpus/j/d.jsonl", ("\n".join(lines)).encode())
        fs.pipe("read-corpus/t/big.txt", b"x" * 5000)
        fs.pipe("read-corpus/t/small.txt", b"small")
        with fs.open("read-corpus/p/d.parquet", "wb") as f:
            pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "text": ["one", "z" * 5000, "three"]}), f,
                           row_group_size=1)
        got = {}
        for fmt, sub in (("jsonl", "j"), ("text", "t"), ("parquet", "p")):
            inp = InputSpec(uri=f"s3://read-corpus/{sub}/", format=fmt, max_doc_bytes=1000)
            got[fmt] = {d.doc_id: d for d in _read_all(inp)}
        s3fs.S3FileSystem.clear_instance_cache()
    assert got["jsonl"]["a"].text == "ok" and got["jsonl"]["c"].text == "fine"
    assert "input.max_doc_bytes=1000" in got["jsonl"]["s3://read-corpus/j/d.jsonl:2"].error
    assert got["text"]["small.txt"].text == "small"
    assert "5000 bytes" in got["text"]["big.txt"].error
    assert got["parquet"]["p2"].text == "three" and "row1" in got["parquet"]["p1"].error


def test_a_list_of_acceptable_answers_is_one_reference_with_its_alternatives(tmp_path):
    """`["27 days", "27"]` for one question was stored as the text "['27 days', '27']"."""
    from pipeline.report.summary import contains_reference
    from schemas.output import reference_alternatives

    p = tmp_path / "qa.jsonl"
    p.write_text(json.dumps({"id": "d", "text": "Leave is 27 days.", "q": ["How long?", "Who?"],
                             "a": [["27 days", "27"], "Ada"]}) + "\n")
    inp = InputSpec(uri=str(p), format="jsonl", question_field="q", answer_field="a")
    (doc,) = read_shard(str(p), inp, str(p))
    assert doc.answers == ["27 days | 27", "Ada"]
    assert reference_alternatives(doc.answers[0]) == ["27 days", "27"] and reference_alternatives("Ada") == ["Ada"]
    assert contains_reference(doc.answers[0], "Every employee gets 27 paid days.")  # the second alternative
    assert not contains_reference(doc.answers[0], "Twenty days.")
    # One answer holding the separator stays one answer (it scored as two alternatives).
    p.write_text(json.dumps({"id": "d", "text": "| billing-db | 740 |", "q": ["Which row?", "Which?"],
                             "a": ["billing-db | 740", ["a | b", "c"]]}) + "\n")
    (doc,) = read_shard(str(p), inp, str(p))
    assert doc.answers == ["billing-db \\| 740", "a \\| b | c"]
    assert reference_alternatives(doc.answers[0]) == ["billing-db | 740"]
    assert reference_alternatives(doc.answers[1]) == ["a | b", "c"]
    assert not contains_reference(doc.answers[0], "The row with the value 740 is billing-db.")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_id_given_to_two_texts_in_one_file_is_an_input_error_on_the_later_record(tmp_path, fmt):
    recs = [{"id": "a", "text": "the cat is red", "questions": ["Which colour?"]},
            {"id": "a", "text": "the cat is red", "questions": ["Which colour?"]},  # the same record again
            {"id": "a", "text": "the dog is blue", "questions": ["Which colour?"]},
            {"id": "b", "text": "the dog is blue", "questions": ["Which colour?"]}]
    path = tmp_path / f"docs.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    else:
        pq.write_table(pa.Table.from_pylist(recs), path)
    docs = _read_all(InputSpec(uri=str(path), format=fmt, question_field="questions"))
    assert [d.error is None for d in docs] == [True, True, False, True]
    assert docs[0].doc_id == docs[1].doc_id == "a" and docs[3].doc_id == "b"
    third, first = (f"{path}:3", f"{path}:1") if fmt == "jsonl" else (f"{path}#row2", f"{path}#row0")
    bad = docs[2]
    assert bad.doc_id == third and bad.error_kind == "input" and bad.questions == ["Which colour?"]
    assert f"id 'a' is already the id of {first}" in bad.error and "its own id" in bad.error


def test_files_a_folders_format_does_not_read_are_counted_by_suffix(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "b.MD", "c.pdf", "sub/d.pdf", "e.rst", "README", ".hidden"):
        (tmp_path / name).write_text("x")
    inp = InputSpec(uri=str(tmp_path), format="text")
    assert skipped_suffixes(inp, "2026-01-01") == {".pdf": 2, ".rst": 1, "": 1}
    assert skipped_suffixes(InputSpec(uri=str(tmp_path / "a.txt"), format="text"), "2026-01-01") == {}
    assert len(_read_all(inp)) == 2  # what the run reads: the .txt and .md files


def test_a_binary_text_column_is_read_as_utf8(tmp_path):
    """Spark and Hive exports often store strings as Parquet binary."""
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": pa.array([b"t1", b"t2"], pa.binary()),
                             "text": pa.array(["caf\u00e9 ticket".encode(), b"\xff\xfe"], pa.binary())}), path)
    docs = _read_all(InputSpec(uri=str(path), format="parquet"))
    assert [(d.doc_id, d.text) for d in docs][0] == ("t1", "caf\u00e9 ticket") and docs[0].error is None
    assert "field 'text' is binary and not valid UTF-8 (byte 0)" in docs[1].error and docs[1].doc_id == "t2"


def test_the_token_limit_names_the_document_and_the_setting(tmp_path):
    from stages.read import doc_tokens_error

    spec = spec_from_dict({"name": "k", "input": {"uri": str(tmp_path), "max_doc_tokens": 10}})
    assert doc_tokens_error(10, spec.input, "g") is None
    msg = doc_tokens_error(11, spec.input, "g")
    assert "'g'" in msg and "11 tokens" in msg and "input.max_doc_tokens=10" in msg


# ----------------------------------------------------------------------------- records a new user sent
def _jsonl_docs(tmp_path, recs: list, **inp) -> list:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in recs) + "\n")
    return read_shard(str(p), InputSpec(uri=str(p), format="jsonl", **inp), str(p))


def test_answers_that_do_not_pair_with_the_questions_fail_the_record_wherever_it_is(tmp_path):
    """Past the records `validate` reads, one answer for two questions scored the first
    question against it and the second against nothing, every row "ok"."""
    recs = [{"id": "late", "text": "Red and blue.", "q": ["What is the code?", "What is the hue?"], "a": ["BLUE"]},
            {"id": "one", "text": "Leave is 27 days.", "q": "How long?", "a": ["27 days", "27"]},
            {"id": "ok", "text": "Ada wrote it.", "q": ["Who?", "When?"], "a": [["Ada", "Ada L."], None]}]
    late, one, ok = _jsonl_docs(tmp_path, recs, question_field="q", answer_field="a")
    assert late.error_kind == "input" and late.text is None and late.questions == ["What is the code?", "What is the hue?"]
    assert "field 'a' has 1 answer(s) for 2 question(s) in 'q'" in late.error and "one answer per question" in late.error
    # One question not in a list: the list is its acceptable answers (validate agrees: test_preflight).
    assert one.error is None and one.questions == ["How long?"] and one.answers == ["27 days | 27"]
    assert ok.error is None and ok.answers == ["Ada | Ada L.", None]


def test_an_answer_that_is_an_object_fails_the_record_naming_it(tmp_path):
    """{"x": 1} as an answer became the reference "{'x': 1}" and the row was "ok": nothing
    could ever be scored against it."""
    recs = [{"id": "obj", "text": "Red.", "questions": ["Code?"], "answers": {"x": 1}},
            {"id": "deep", "text": "Blue.", "questions": ["Hue?", "Sky?"], "answers": ["blue", [["b"], "c"]]},
            {"id": "ok", "text": "Ada.", "questions": ["Who?", "Age?"], "answers": [["Ada", "Ada L."], 36]}]
    obj, deep, ok = _jsonl_docs(tmp_path, recs, question_field="questions", answer_field="answers")
    assert obj.error_kind == "input" and obj.questions == ["Code?"]
    assert "d.jsonl:1: answer 1 of field 'answers' is an object ({\"x\": 1}); fix: an answer is a string" in obj.error
    assert "answer 2 of field 'answers' is a list inside a list of acceptable answers" in deep.error
    assert ok.error is None and ok.answers == ["Ada | Ada L.", "36"]


def test_a_question_that_is_not_a_non_empty_string_fails_the_record_naming_it(tmp_path):
    """[42, null, ""] were asked as "42", "None" and "", each answered and "ok"."""
    recs = [{"id": "n", "text": "Numbers.", "questions": ["Fine?", 42, None, " ", {"q": "x"}]}]
    (doc,) = _jsonl_docs(tmp_path, recs, question_field="questions")
    assert doc.error_kind == "input" and doc.questions == ["Fine?"]  # the usable one keeps its own error row
    for part in ("question 2 of field 'questions' is not a string (42)", "question 3 of field 'questions' is null",
                 "question 4 of field 'questions' is empty", 'question 5 of field \'questions\' is not a string ({"q": "x"})',
                 "fix: questions are non-empty strings"):
        assert part in doc.error, (part, doc.error)


def test_a_question_asked_twice_is_one_request_and_with_another_answer_an_error(tmp_path):
    """Both had one request id: the second answer was lost without a word."""
    recs = [{"id": "same", "text": "The code is RED.", "q": ["Code?", "Code?", "Sky?"], "a": ["RED", "RED", None]},
            {"id": "other", "text": "The code is RED.", "q": ["Code?", "Code?"], "a": ["RED", "BLUE"]}]
    same, other = _jsonl_docs(tmp_path, recs, question_field="q", answer_field="a")
    assert same.error is None and same.questions == ["Code?", "Sky?"] and same.answers == ["RED", None]
    assert other.error_kind == "input" and other.questions == ["Code?"]
    assert "question 2 of field 'q' repeats question 1 ('Code?') with another answer; fix: ask it once" in other.error


def test_ids_that_no_one_can_join_on_fail_the_record(tmp_path):
    recs = [{"id": "", "text": "Empty id."}, {"id": True, "text": "Boolean id."}, {"id": 1.5, "text": "Fine."},
            {"id": ["a"], "text": "List id."}]
    empty, boolean, number, listed = _jsonl_docs(tmp_path, recs)
    where = str(tmp_path / "d.jsonl")
    assert empty.doc_id == f"{where}:1" and "field 'id' is empty" in empty.error
    assert boolean.doc_id == f"{where}:2" and "field 'id' is true, a boolean; fix: ids are strings or numbers" in boolean.error
    assert number.error is None and number.doc_id == "1.5"
    assert "field 'id' is not a string or a number" in listed.error


def test_a_byte_order_mark_is_not_part_of_the_first_record_or_a_text(tmp_path):
    """Windows editors start a UTF-8 file with one: json refused line 1, the text kept U+FEFF."""
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "text": "First."}\r\n{"id": "b", "text": "Second."}\r\n')
    docs = read_shard(str(p), InputSpec(uri=str(p), format="jsonl"), str(p))
    assert [(d.doc_id, d.text, d.error) for d in docs] == [("a", "First.", None), ("b", "Second.", None)]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "note.txt").write_bytes(b"\xef\xbb\xbfA note.")
    (text,) = _read_all(InputSpec(uri=str(tmp_path / "t"), format="text"))
    assert text.text == "A note."
    p.write_bytes('{"id": "c", "text": "caf\u00e9"}\n'.encode("latin-1"))
    (latin,) = read_shard(str(p), InputSpec(uri=str(p), format="jsonl"), str(p))
    assert "is not valid UTF-8 (byte 24); fix: save the file as UTF-8 (from Latin-1: iconv" in latin.error


def test_a_utf16_file_is_named_as_utf16_not_latin1(tmp_path):
    """A UTF-16 export (Windows "Unicode", PowerShell's ``>``) was told to convert from Latin-1,
    which iconv does without complaint and leaves the file still unreadable."""
    p = tmp_path / "docs.jsonl"
    lines = ['{"id": "a", "text": "First."}', '{"id": "b", "text": "Second."}', '{"id": "c", "text": "Third."}']
    p.write_bytes(("\n".join(lines) + "\n").encode("utf-16"))
    first = read_shard(str(p), InputSpec(uri=str(p), format="jsonl"), str(p))[0]
    # One row for the file: its later lines read as broken JSON (and a stray NUL) said "fix the line".
    assert [d.doc_id for d in read_shard(str(p), InputSpec(uri=str(p), format="jsonl"), str(tmp_path))] == [str(p)]
    assert first.doc_id == str(p) and "is not valid UTF-8 (byte 0); the file is UTF-16" in first.error
    assert "iconv -f utf-16 -t utf-8" in first.error and "latin1" not in first.error
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "note.txt").write_bytes("A note.".encode("utf-16"))
    (text,) = _read_all(InputSpec(uri=str(tmp_path / "t"), format="text"))
    assert "iconv -f utf-16 -t utf-8" in text.error and "note.txt" in text.error


def test_a_line_nested_too_deep_is_an_error_row_naming_it(tmp_path):
    """A record with 100,000 nested brackets raised RecursionError out of the reader: validate
    printed it as the whole file's error, naming no line and no fix."""
    deep = '{"id": "c", "text": "T.", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    good, bad, after = _jsonl_docs(tmp_path, [{"id": "a", "text": "A."}, deep, {"id": "b", "text": "B."}])
    assert (good.error, after.error) == (None, None) and bad.doc_id.endswith("d.jsonl:2")
    assert "d.jsonl:2 is JSON nested deeper than Python's reader allows" in bad.error and "fix: flatten" in bad.error


def test_every_unusable_record_says_the_fix(tmp_path):
    """A bad line, a line that is not an object, a text or id missing, null, a number or
    empty: each error row named its line and field but not what to do about it."""
    recs = ['{"id": "j", "text": "oops",', "[1, 2]", {"id": "m"}, {"id": "n", "text": None},
            {"id": "x", "text": 12345}, {"id": "e", "text": " "}, {"text": "No id."}, {"id": "ok", "text": "Fine."}]
    docs = _jsonl_docs(tmp_path, recs)
    assert "d.jsonl:1 is not valid JSON (Expecting property name enclosed in double quotes at column 28); fix: correct" in docs[0].error
    assert "d.jsonl:2 is not a JSON object (a JSON array); fix: one object per line" in docs[1].error
    for doc, what in zip(docs[2:6], ["is missing", "is null", "is not a string (12345)", "is empty"]):
        assert f"field 'text' {what}; fix: give the record its document as a non-empty string in 'text'" in doc.error
    assert "d.jsonl:7: field 'id' is missing; fix: give the record a non-empty string or number id in 'id'" in docs[6].error
    assert docs[7].error is None
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "blank.txt").write_text(" \n")
    (blank,) = _read_all(InputSpec(uri=str(tmp_path / "t"), format="text"))
    assert "blank.txt is empty; fix: give the file its document's text, or remove it" in blank.error


def test_compressed_jsonl_is_read_and_hidden_names_are_not(tmp_path):
    """A .jsonl.gz failed as 'not valid UTF-8'; Spark's _temporary/ and editors' dot files were
    read as documents."""
    import bz2
    import gzip

    (tmp_path / "_temporary" / "0").mkdir(parents=True)
    (tmp_path / ".cache").mkdir()
    for name in ("_temporary/0/part-1.jsonl", ".cache/x.jsonl", ".draft.jsonl", "_SUCCESS.jsonl"):
        (tmp_path / name).write_text(json.dumps({"id": name, "text": "Not input."}) + "\n")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"id": "g", "text": "Zipped."}\n'))
    (tmp_path / "b.jsonl.bz2").write_bytes(bz2.compress(b'{"id": "z", "text": "Bzipped."}\n'))
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "p", "text": "Plain."}) + "\n")
    inp = InputSpec(uri=str(tmp_path), format="jsonl")
    assert [(d.doc_id, d.text) for d in _read_all(inp)] == [("g", "Zipped."), ("z", "Bzipped."), ("p", "Plain.")]
    assert skipped_suffixes(inp, "2026-01-01") == {}


def test_a_broken_compressed_file_is_an_input_error_naming_it(tmp_path):
    """A random-bytes .jsonl.gz among good files was a storage error (retried on every rerun)
    and refused the whole night when it sorted first."""
    import gzip
    import os

    from schemas.output import INPUT

    (tmp_path / "a.jsonl.gz").write_bytes(os.urandom(200))
    whole = gzip.compress(b"".join(json.dumps({"id": f"t{i}", "text": f"Doc {i}."}).encode() + b"\n"
                                   for i in range(50)))
    (tmp_path / "b.jsonl.gz").write_bytes(whole[: len(whole) // 2])  # cut off in the middle
    (tmp_path / "c.jsonl.bz2").write_bytes(b"BZh9" + os.urandom(100))
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "p", "text": "Plain."}) + "\n")
    docs = _read_all(InputSpec(uri=str(tmp_path), format="jsonl"))
    bad = [d for d in docs if d.error]
    assert [d.doc_id for d in docs if not d.error][-1] == "p" and len(bad) == 3
    assert all(d.error_kind == INPUT and "fix: export it again" in d.error for d in bad)
    assert "a.jsonl.gz is not a readable gzip file (BadGzipFile" in bad[0].error
    assert "b.jsonl.gz" in bad[1].error and "EOFError" in bad[1].error  # cut off: its end is missing
    assert "is not a readable bz2 file" in bad[2].error



def test_a_compressed_file_cut_off_keeps_every_record_before_the_cut(tmp_path):
    """A trial's export cut at 97% kept 33 of the 43 records that still decompress: the
    reader gathered a whole block before the break raised, and lost it. Every complete line
    before the cut is a document now, then the file's error."""
    import gzip
    import zlib

    lines = b"".join(json.dumps({"id": f"t{i}", "text": f"Document {i}. " + "word " * 300}).encode() + b"\n"
                     for i in range(300))
    whole = gzip.compress(lines, mtime=0)
    cut = whole[: len(whole) * 97 // 100]
    (tmp_path / "a.jsonl.gz").write_bytes(cut)
    readable = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut)  # what the cut file still holds
    complete = readable.count(b"\n")
    assert 250 < complete < 300
    docs = _read_all(InputSpec(uri=str(tmp_path), format="jsonl"))
    assert [d.doc_id for d in docs[:-1]] == [f"t{i}" for i in range(complete)]
    assert "EOFError" in docs[-1].error and f"after 't{complete - 1}'" in docs[-1].error
