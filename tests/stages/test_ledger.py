"""The read stage's request ledger: what a run's input holds, without reading it again."""

from __future__ import annotations

from pathlib import Path

from alone import run_alone

from schemas.loading import spec_from_dict
from schemas.output import RETRYABLE
from stages.layout import runs_root, staging_dir
from stages.ledger import clear, ledger_root, read_ledger, write_block
from stages.read import Document
from stages.requests import expand_requests, generation_fingerprint

DATE = "2026-06-01"
SHARDS = ["/in/a.jsonl", "/in/b.jsonl", "/in/c.jsonl"]


def _spec(tmp_path, **inp):
    return spec_from_dict({"name": "l", "input": {"uri": str(tmp_path / "in"), "format": "jsonl", **inp},
                           "output": {"uri": str(tmp_path / "out")}})


def _record(spec, shard: int, n_docs: int) -> list[dict]:
    """Ledger rows of ``n_docs`` documents of shard ``shard``, as the read stage makes them."""
    out = []
    for d in range(n_docs):
        doc = Document(f"{shard}-{d}", SHARDS[shard], f"text {shard} {d}")
        for req in expand_requests(doc, spec, "r1", DATE, generation_fingerprint(spec)):
            out.append({"shard": shard, "doc": d, **{k: req[k] for k in (
                "request_id", "doc_id", "source_uri", "prompt", "question", "reference")}})
    return out


def test_requests_in_input_order_and_placeholders_for_unread_files(tmp_path):
    spec = _spec(tmp_path)
    root = str(tmp_path / "out")
    # One batch covered shards 0 and 1 (shard 1 has no document); shard 2 was never read.
    write_block(root, DATE, "r1", [0, 1], _record(spec, 0, 3))
    ledger = read_ledger(root, DATE, "r1")
    assert ledger.shards == {0, 1} and not ledger.complete(3)
    reqs = ledger.requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == ["0-0", "0-1", "0-2", SHARDS[2]]
    # The placeholder is the request a file that fails to read as a whole gets: a complete
    # rerun reads the file and drops it as stale.
    bad = Document(SHARDS[2], SHARDS[2], None, error="x", error_kind=RETRYABLE)
    (want,) = expand_requests(bad, spec, "r1", DATE, generation_fingerprint(spec))
    assert reqs[-1]["request_id"] == want["request_id"] and reqs[-1]["job"] == "l"
    write_block(root, DATE, "r1", [2], _record(spec, 2, 2))
    full = read_ledger(root, DATE, "r1")
    assert full.complete(3) and len(full.requests(spec, SHARDS, "r1", DATE)) == 5
    assert ledger_root(root, DATE) == f"{runs_root(root)}/_ledger/{DATE}"  # beside the output root
    assert not (tmp_path / "out").exists()  # nothing a reader of the table would list
    # A ledger an earlier version left inside the output root goes with this one.
    legacy = tmp_path / "out" / "_ledger" / DATE / "r0"
    legacy.mkdir(parents=True)
    (legacy / "shards-000000.parquet").write_bytes(b"")
    clear(root, DATE)
    assert not Path(ledger_root(root, DATE)).exists() and not legacy.parent.exists()
    assert read_ledger(root, DATE, "r1").files == 0


def test_the_limit_counts_documents_in_input_order(tmp_path):
    spec = _spec(tmp_path, limit=4)
    root = str(tmp_path / "out")
    write_block(root, DATE, "r1", [1, 2], _record(spec, 1, 3) + _record(spec, 2, 3))
    write_block(root, DATE, "r1", [0], _record(spec, 0, 2))
    reqs = read_ledger(root, DATE, "r1").requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == ["0-0", "0-1", "1-0", "1-1"]
    # An unread file before the limit is reached: its document count is unknown, so no
    # later request may be left out (a complete rerun drops what is beyond the limit).
    root2 = str(tmp_path / "out2")
    write_block(root2, DATE, "r1", [1, 2], _record(spec, 1, 3) + _record(spec, 2, 3))
    reqs = read_ledger(root2, DATE, "r1").requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == [SHARDS[0]] + [f"{s}-{d}" for s in (1, 2) for d in range(3)]


def _ledger_of(tmp_path, spec, blocks: int, shards_per_block: int, docs: int) -> tuple[str, list[str]]:
    """A run's ledger of ``blocks`` read batches, written as the read stage writes them."""
    root = str(tmp_path / f"out-{blocks}")
    shards = [f"/in/{i:05d}.jsonl" for i in range(blocks * shards_per_block)]
    fp = generation_fingerprint(spec)
    for b in range(blocks):
        rows = []
        for s in range(b * shards_per_block, (b + 1) * shards_per_block):
            for d in range(docs):
                doc = Document(f"{s}-{d}", shards[s], f"text {s} {d} " + "word " * 40)
                for req in expand_requests(doc, spec, "r1", DATE, fp):
                    rows.append({"shard": s, "doc": d, **{k: req[k] for k in (
                        "request_id", "doc_id", "source_uri", "prompt", "question", "reference")}})
        write_block(root, DATE, "r1", list(range(b * shards_per_block, (b + 1) * shards_per_block)), rows)
    return root, shards


def test_the_driver_reads_the_ledger_one_block_at_a_time(tmp_path):
    """The driver's request bookkeeping (progress total, abort path) walks the ledger block
    by block: 10x the corpus in 10x the blocks costs the same peak memory, not 10x."""
    spec = _spec(tmp_path)
    peaks = {}
    for blocks in (2, 20):
        root, shards = _ledger_of(tmp_path, spec, blocks, shards_per_block=5, docs=40)
        ledger = read_ledger(root, DATE, "r1")
        assert ledger.complete(len(shards)) and ledger.files == blocks
        # Traced in a child alone (tests/alone.py says why), after a first walk: that walk's
        # imports would dwarf one block's rows.
        n, peaks[blocks] = run_alone(f"""
            import tracemalloc
            from schemas.loading import spec_from_dict
            from stages.ledger import read_ledger
            spec = spec_from_dict({spec.model_dump(mode="json", exclude_unset=True)!r})
            ledger = read_ledger({root!r}, {DATE!r}, "r1")
            sum(1 for _ in ledger.iter_requests(spec, {shards!r}, "r1", {DATE!r}))
            tracemalloc.start()
            n = sum(1 for _ in ledger.iter_requests(spec, {shards!r}, "r1", {DATE!r}))
            done([n, tracemalloc.get_traced_memory()[1]])
        """)
        assert n == blocks * 5 * 40
    # One block of 200 requests is ~100-200 KB as Python rows; the whole 4,000 would be 20x.
    assert peaks[20] < 1.5 * peaks[2], peaks


def test_an_aborted_run_stages_its_error_rows_in_blocks(tmp_path, monkeypatch):
    import pipeline.runner as runner

    spec = _spec(tmp_path)
    root, shards = _ledger_of(tmp_path, spec, blocks=2, shards_per_block=2, docs=5)
    monkeypatch.setattr(runner, "MISSING_BLOCK_ROWS", 6)
    figures = runner.write_missing_as_errors(spec, root, DATE, "r1", RuntimeError("node lost"), shards)
    staged = sorted((Path(staging_dir(root, DATE)) / "r1").glob("*.staged"))
    assert figures.num_rows == 20 and len(staged) == 4  # 6 + 6 + 6 + 2
    assert "output_text" not in figures.column_names
    assert set(figures.column("error_kind").to_pylist()) == {RETRYABLE}
    assert len(set(figures.column("request_id").to_pylist())) == 20


def test_no_placeholder_for_an_unread_file_past_the_limit(tmp_path):
    """The limit reached in a file read, a later file the read stage never reached has no
    documents of this run: no placeholder (a retryable error row for a file the limit
    leaves out would be retried night after night)."""
    spec = _spec(tmp_path, limit=2)
    root = str(tmp_path / "out")
    write_block(root, DATE, "r1", [0], _record(spec, 0, 2))
    reqs = read_ledger(root, DATE, "r1").requests(spec, SHARDS, "r1", DATE)
    assert [r["doc_id"] for r in reqs] == ["0-0", "0-1"]


def test_a_complete_run_says_what_it_read_for_the_rows_it_supersedes(tmp_path):
    """``run_requests``: None until every file is covered; then the request ids, their
    (doc_id, prompt) keys, the files read whole (none under input.limit: a file's input-error
    row the run never reached must not be superseded) and the ids named in two files."""
    for limit in (None, 5):
        spec = _spec(tmp_path, limit=limit)
        root = str(tmp_path / f"out-{limit}")
        write_block(root, DATE, "r1", [0], _record(spec, 0, 2))
        assert read_ledger(root, DATE, "r1").run_requests(spec, SHARDS, "r1", DATE) is None  # files 1, 2 unread
        # File 1 names document "0-1" again (files are read apart: the run can only say so).
        again = [{"shard": 1, "doc": 0, **{k: req[k] for k in (
            "request_id", "doc_id", "source_uri", "prompt", "question", "reference")}}
            for req in expand_requests(Document("0-1", SHARDS[1], "other text"), spec, "r1", DATE,
                                       generation_fingerprint(spec))]
        write_block(root, DATE, "r1", [1, 2], again)
        ledger = read_ledger(root, DATE, "r1")
        run = ledger.run_requests(spec, SHARDS, "r1", DATE)
        reqs = ledger.requests(spec, SHARDS, "r1", DATE)
        assert run.ids == {r["request_id"] for r in reqs} and len(run.ids) == 3
        assert run.keys == {(r["doc_id"], r["prompt"]) for r in reqs}
        assert run.files == (frozenset(SHARDS) if limit is None else frozenset())
        assert run.shared == 1 and run.shared_examples == {"0-1": [SHARDS[0], SHARDS[1]]}


def test_every_request_is_known_where_the_limit_was_reached_in_files_read(tmp_path):
    """Under input.limit the read stage stops at the limit, so over a folder the ledger never
    covers every file: ``run_requests`` said None, and a limited run superseded nothing (a spec
    changed left two rows per document) nor could its date be marked complete
    (stages/completion.py). The requests are all known when the limit was reached before the
    first file not read; a placeholder among them (a file before the limit not read), or no
    limit with a file unread: None."""
    limited = _spec(tmp_path, limit=2)
    root = str(tmp_path / "out")
    write_block(root, DATE, "r1", [0], _record(limited, 0, 2))
    ledger = read_ledger(root, DATE, "r1")
    known = ledger.run_requests(limited, SHARDS, "r1", DATE)
    assert known.ids == {r["request_id"] for r in _record(limited, 0, 2)} and known.files == frozenset()
    assert known.covered == frozenset({SHARDS[0]})  # only file 0's rows can be replaced by key
    # The limit not reached in file 0 (3 documents asked, 2 there): file 1 was to be read.
    assert ledger.run_requests(_spec(tmp_path, limit=3), SHARDS, "r1", DATE) is None
    assert ledger.run_requests(_spec(tmp_path), SHARDS, "r1", DATE) is None
    write_block(root, DATE, "r1", [1, 2], _record(limited, 2, 1))
    whole = read_ledger(root, DATE, "r1").run_requests(_spec(tmp_path), SHARDS, "r1", DATE)
    assert len(whole.ids) == 3 and whole.files == frozenset(SHARDS) and whole.covered is None
    # Every file read (Ray reads ahead of the limit), the limit reached in file 0: only file 0's
    # rows may be replaced by key, not those of the files read past the limit.
    ahead = read_ledger(root, DATE, "r1").run_requests(limited, SHARDS, "r1", DATE)
    assert ahead.ids == known.ids and ahead.covered == frozenset({SHARDS[0]})
    # The limit reached in file 2: file 1, which yields no document now (emptied), is covered
    # too (it may hold the old row of a document since moved to file 2).
    three = read_ledger(root, DATE, "r1").run_requests(_spec(tmp_path, limit=3), SHARDS, "r1", DATE)
    assert len(three.ids) == 3 and three.covered == frozenset(SHARDS)
