"""stages/listing.py: the files an input names."""

from __future__ import annotations

import pytest
from alone import run_alone

from schemas.spec import InputSpec
from stages.listing import list_shards, skipped_suffixes


def test_missing_uri_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        list_shards(InputSpec(uri=str(tmp_path / "nope")), "2026-01-01")
    with pytest.raises(ValueError, match="no text files"):
        list_shards(InputSpec(uri=str(tmp_path)), "2026-01-01")


def test_a_folder_without_the_formats_files_names_what_it_holds_and_the_fix(tmp_path):
    """A folder of .txt and .csv files under format jsonl was refused naming only the suffixes
    looked for: no word of what was there, nor of the fix."""
    (tmp_path / "a.txt").write_text("hi")
    (tmp_path / "b.csv").write_text("id,text")
    (tmp_path / "_SUCCESS").write_text("")
    with pytest.raises(ValueError) as e:
        list_shards(InputSpec(uri=str(tmp_path), format="jsonl"), "2026-01-01")
    assert "has no jsonl files (looked for .jsonl" in str(e.value)
    assert "it holds 1 .csv, 1 .txt; fix: set input.format: text to read them, or point input.uri" in str(e.value)
    # A compressed export is named by its whole suffix, and the format that reads it.
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "part-0.jsonl.gz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"it holds 1 \.jsonl\.gz; fix: set input.format: jsonl to read them"):
        list_shards(InputSpec(uri=str(tmp_path / "gz"), format="text"), "2026-01-01")
    assert skipped_suffixes(InputSpec(uri=str(tmp_path / "gz"), format="parquet"), "2026-01-01") == {".jsonl.gz": 1}
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="it holds no files .*; fix: point input.uri at the data"):
        list_shards(InputSpec(uri=str(tmp_path / "empty"), format="jsonl"), "2026-01-01")


def test_listing_holds_one_folder_of_metadata_at_a_time(tmp_path):
    """The listing keeps the paths it matched, not every file's metadata: 10x the folders
    (same files each) leaves the peak beyond the kept list about where it was."""
    extra = {}
    for folders in (2, 20):
        root = tmp_path / f"corpus{folders}"
        for f in range(folders):
            (root / f"day={f:02d}").mkdir(parents=True)
            for i in range(300):
                (root / f"day={f:02d}" / f"doc{i:03d}.txt").write_text("x")
        # Traced in a child alone: tests/alone.py says why.
        extra[folders] = run_alone(f"""
            import tracemalloc
            from schemas.spec import InputSpec
            from stages.listing import list_shards
            tracemalloc.start()
            paths = list_shards(InputSpec(uri={str(root)!r}, format="text"), "")
            held, peak = tracemalloc.get_traced_memory()
            assert len(paths) == {folders * 300} and paths == sorted(paths)
            done(peak - held)
        """)
    # All 6,000 files' metadata at once was ~10x the 600 of two folders.
    assert extra[20] < 2 * extra[2], extra


def test_a_pattern_in_the_input_uri_is_named_as_such(tmp_path):
    with pytest.raises(ValueError, match=r"patterns like \* are not expanded: name the folder"):
        list_shards(InputSpec(uri=str(tmp_path / "*.jsonl"), format="jsonl"), "2026-01-01")


def test_the_listing_digest_changes_with_any_file_and_only_then(tmp_path):
    """``list_input``'s digest (a complete date is recognised by it, stages/completion.py): the
    same files untouched give the same digest; a file rewritten with bytes of the same size, a
    file added or removed, give another. A store whose entries say nothing of change gives none."""
    import os

    import fsspec

    from stages.listing import change_stamp, list_input

    root = tmp_path / "in"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "b.txt").write_text("beta")
    inp = InputSpec(uri=str(root), format="text")
    first = list_input(inp, "")
    assert first.shards == list_shards(inp, "") and first.digest
    assert list_input(inp, "").digest == first.digest  # listed again, untouched
    digests = {first.digest}
    (root / "a.txt").write_text("ALPHA")  # the same size: the stamp (mtime, ctime) tells it
    st = (root / "a.txt").stat()
    os.utime(root / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    digests.add(list_input(inp, "").digest)
    (root / "c.txt").write_text("gamma")
    digests.add(list_input(inp, "").digest)
    (root / "b.txt").unlink()
    digests.add(list_input(inp, "").digest)
    assert len(digests) == 4
    # One file as the input: its own entry.
    one = InputSpec(uri=str(root / "c.txt"), format="text")
    assert list_input(one, "").digest == list_input(one, "").digest != first.digest
    # A store whose entries carry times only (fsspec's memory store; sftp's whole seconds): a
    # same-size rewrite within a tick would pass unseen, so no digest (a rerun reads it).
    fsspec.filesystem("memory").pipe("/listing-digest/d.txt", b"delta")
    mem = InputSpec(uri="memory://listing-digest", format="text")
    assert list_input(mem, "").digest is None
    fsspec.filesystem("memory").rm("/listing-digest", recursive=True)
    assert change_stamp({"name": "x", "size": 3, "type": "file"}) is None  # e.g. an HTTP listing
    assert change_stamp({"name": "x", "size": 3, "mtime": 1.0}) is None
    # The size is in the stamp too (the contract: path, size and change stamps): another
    # length is another stamp even beside the same version field.
    assert change_stamp({"name": "x", "size": 3, "ETag": '"e1"'}) != change_stamp({"name": "x", "size": 4,
                                                                                 "ETag": '"e1"'})
    # An object store's version or content hash: its stamp changes with every rewrite.
    assert change_stamp({"name": "x", "size": 3, "ETag": '"e1"'}) != change_stamp({"name": "x", "size": 3,
                                                                                 "ETag": '"e2"'})


def test_a_rewrite_on_object_storage_changes_the_digest_in_one_process(monkeypatch):
    """s3fs keeps listings for the process's life: a second listing in the same process (a
    notebook, a test) saw a nested file's old ETag, so a rewritten file kept its digest and a
    complete date's mark matched (stages/completion.py)."""
    import s3fs
    from s3_server import moto_s3

    from stages.listing import list_input

    with moto_s3() as server:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        # s3fs keeps one instance per settings: one made for another test's server (the
        # environment is read when it is made) would still point there.
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            fs = server.filesystem()
            fs.mkdir("digest")
            fs.pipe("digest/in/night/a.jsonl", b'{"id": "a", "text": "alpha"}\n')
            inp = InputSpec(uri="s3://digest/in", format="jsonl")
            first = list_input(inp, "")  # this process's s3fs instance, its listings cached
            assert first.digest and list_input(inp, "").digest == first.digest
            fs.pipe("digest/in/night/a.jsonl", b'{"id": "a", "text": "ALPHA"}\n')  # the same size
            assert list_input(inp, "").digest != first.digest
        finally:
            s3fs.S3FileSystem.clear_instance_cache()  # none left pointing at this server
