"""Row <-> batch helpers for the stages.

Ray Data hands callable stages a batch as ``dict[str, np.ndarray]`` (batch_format
"numpy"); list-valued columns arrive as object arrays. Stages work row by row
internally, so they convert with ``batch_to_rows`` / ``rows_to_batch``.

The columns of each hop (RequestRow -> TokenizedRow -> CompressedRow -> OutputRow)
are typed and documented in schemas/rows.py.
Contract: a stage never drops a row. A row whose ``error`` is set passes through
untouched; a row that fails in a stage gets ``error = "<stage>: <message>"`` and
``error_kind`` (input | retryable, see ``fail``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from schemas.output import ERROR_KINDS, RETRYABLE, classify_error

log = logging.getLogger("longdoc")


def batch_to_rows(batch: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    cols = list(batch)
    n = len(batch[cols[0]]) if cols else 0
    return [{c: _plain(batch[c][i]) for c in cols} for i in range(n)]


def rows_to_batch(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    cols: list[str] = []
    for r in rows:
        for c in r:
            if c not in cols:
                cols.append(c)
    out: dict[str, np.ndarray] = {}
    for c in cols:
        values = [r.get(c) for r in rows]
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        out[c] = arr
    return out


def _plain(v: Any) -> Any:
    """numpy scalars/arrays -> Python values (token arrays -> list[int]).

    NaN becomes None: Ray's Arrow->numpy conversion turns an all-null column into
    float NaN, and no request column uses NaN as a real value.
    """
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def fail(
    row: dict[str, Any], stage: str, err: BaseException | str, kind: str | None = None,
    traced: set[str] | None = None,
) -> dict[str, Any]:
    """Mark a row failed with a readable message naming the stage, and its ``error_kind``.

    ``kind``: schemas.output.INPUT (final: the request itself is bad) or RETRYABLE
    (infrastructure); the raise site knows best, so pass it there. Without it the
    kind comes from ``schemas.output.classify_error(err)``. ``traced``: see
    ``error_message``.
    """
    if kind is not None and kind not in ERROR_KINDS:
        raise ValueError(f"error kind {kind!r} is not one of {', '.join(ERROR_KINDS)}")
    kind = kind or classify_error(err)
    row["error"] = error_message(stage, err, kind, traced)
    row["error_kind"] = kind
    return row


def error_message(stage: str, err: BaseException | str, kind: str, traced: set[str] | None = None) -> str:
    """A failed row's ``error``: ``"{stage}: {Type}: {message}"`` (a string ``err`` as is).

    A row keeps one line, so the stack of a retryable exception (an unexpected one: a
    bug or the infrastructure; an input error's message says what to fix) is logged where
    the process's log goes (the console, or Ray's worker logs), once per exception type
    that ``traced`` has not seen: the set of type names the calling stage object owns (a
    night of rows failing alike logs one stack). None: nothing is logged."""
    if isinstance(err, str):
        return f"{stage}: {err}"
    msg = f"{stage}: {type(err).__name__}: {err}"
    if kind == RETRYABLE and traced is not None and type(err).__name__ not in traced:
        traced.add(type(err).__name__)
        log.warning("a row failed in the %s stage (retryable; its stack, logged once per error type): %s",
                    stage, msg, exc_info=err)
    return msg
