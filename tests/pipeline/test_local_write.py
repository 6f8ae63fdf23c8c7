"""pipeline/local_write.py: a test write in the nearest existing folder, nothing created."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.local_write import write_error


def test_the_nearest_existing_folder_is_test_written_and_nothing_is_left(tmp_path):
    here, error = write_error(tmp_path / "a" / "b")
    assert (here, error) == (tmp_path, None)
    assert list(tmp_path.iterdir()) == []  # neither a folder nor the test file


def test_a_file_on_the_way_is_named():
    with tempfile.NamedTemporaryFile() as f:
        here, error = write_error(Path(f.name) / "cache")
        assert here == Path(f.name) and isinstance(error, NotADirectoryError)


def test_an_unwritable_place_returns_its_error():
    here, error = write_error(Path("/proc/nope/x"))
    assert here.as_posix() == "/proc" and isinstance(error, OSError)
