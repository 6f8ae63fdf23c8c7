"""Row <-> batch helpers (stages/rows.py): Ray's numpy batches back to plain rows and
forth without losing a column, and ``fail`` marking a row with its stage and kind."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.output import INPUT, RETRYABLE
from stages.rows import batch_to_rows, fail, rows_to_batch


def test_rows_round_trip_through_a_batch_and_columns_are_unioned():
    rows = [{"id": "a", "ids": [1, 2, 3], "score": 0.5}, {"id": "b", "extra": True}]
    batch = rows_to_batch(rows)
    assert list(batch) == ["id", "ids", "score", "extra"]
    assert all(arr.dtype == object and len(arr) == 2 for arr in batch.values())
    assert batch_to_rows(batch) == [{"id": "a", "ids": [1, 2, 3], "score": 0.5, "extra": None},
                                    {"id": "b", "ids": None, "score": None, "extra": True}]
    assert rows_to_batch([]) == {} and batch_to_rows({}) == []


def test_numpy_values_as_ray_hands_them_become_plain_python():
    """Ray Data's Arrow -> numpy conversion: token lists as arrays, numbers as numpy scalars,
    an all-null column as float NaN."""
    batch = {"ids": np.array([np.array([5, 6]), np.array([7])], dtype=object),
             "n": np.array([3, 4], dtype=np.int64), "missing": np.array([math.nan, math.nan])}
    rows = batch_to_rows(batch)
    assert rows == [{"ids": [5, 6], "n": 3, "missing": None}, {"ids": [7], "n": 4, "missing": None}]
    assert type(rows[0]["n"]) is int and type(rows[0]["ids"][0]) is int


def test_fail_names_the_stage_and_takes_the_kind_from_the_raise_site():
    row = fail({"request_id": "r"}, "tokenize", ValueError("no text"), kind=INPUT)
    assert (row["error"], row["error_kind"]) == ("tokenize: ValueError: no text", INPUT)
    assert fail({}, "rag", MemoryError("embedder"))["error_kind"] == RETRYABLE  # by type
    assert fail({}, "read", "file vanished")["error"] == "read: file vanished"
    with pytest.raises(ValueError, match="error kind 'final' is not one of input, retryable"):
        fail({}, "read", "x", kind="final")


def test_a_retryable_failure_logs_its_stack_once_per_type_the_stage_has_seen(caplog):
    """A row keeps one line; the stack of an unexpected error is logged, once a type per stage
    object (the set it owns), and not at all without one."""
    def raised(err: BaseException) -> BaseException:
        try:
            raise err
        except BaseException as e:  # noqa: BLE001 - the test wants the raised exception
            return e

    caplog.set_level("WARNING", logger="longdoc")
    traced: set[str] = set()
    for _ in range(3):  # a night of rows failing alike: one stack
        row = fail({}, "bm25-test", raised(IndexError("list index out of range")), traced=traced)
        assert row["error_kind"] == RETRYABLE
    fail({}, "bm25-test", raised(KeyError("k")), traced=traced)  # another type: its own
    fail({}, "bm25-test", raised(ValueError("a bad document")), kind=INPUT, traced=traced)  # its message says the fix
    fail({}, "bm25-test", raised(OSError("no stage object")))  # no set: not logged
    logged = [r for r in caplog.records if "bm25-test" in r.getMessage()]
    assert [r.exc_info[0] for r in logged] == [IndexError, KeyError] and traced == {"IndexError", "KeyError"}
    assert "bm25-test: IndexError: list index out of range" in logged[0].getMessage()
