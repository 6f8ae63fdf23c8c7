"""What a decode engine holds and has done at one moment, for a progress line.

Contract:
- ``EngineSnapshot`` holds the numbers of one engine (``Engine.snapshot()``), or the sum
  of several (``EngineSnapshot.total``: the Ray runner's generate actors, one engine
  each). Its fields are plain numbers, so it crosses processes as ``asdict`` and back.
- ``describe(snapshot)`` is the ONE text both runners print for it:
  ``"3 decoding (41 tokens), 1 compressing (3500 document tokens, chunk 2 of 7, ~40s
  left), 0 prefilling, 5 queued"`` (the compressing part only while rows are compressed).
  ``Engine.activity()`` is ``describe(engine.snapshot())``.
- ``engines_line(snapshot, engines)``: ``"engine: <describe>"`` for one engine,
  ``"<n> engines: <describe>"`` for several (the head before ':' names the phase on the
  progress line).
- ``snapshot.progress()`` is the tuple the progress line's ETA counts (pipeline/progress.py
  ``RunProgress.engine``): (rows finished, their output tokens, rows decoding now, the
  tokens those have so far, the share of engine time spent prefilling). Summed engines
  give the sums, and the prefill share of their summed time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EngineSnapshot:
    """One engine's (or several engines' summed) rows in hand and work done."""

    decoding: int = 0  # rows in a decode slot
    decoding_tokens: int = 0  # the tokens they have generated so far
    compressing: int = 0  # rows inside a method's prefill (e.g. Finch's pass)
    compressing_tokens: int = 0  # their documents' tokens (each document once)
    chunks_read: int = 0  # chunks that prefill has read so far (0 while none runs)
    chunks_total: int | None = None  # chunks it reads in all; None: not known
    reading_left_s: float | None = None  # its time left at its rate so far (after two chunks)
    prefilling: int = 0  # rows the engine is prefilling itself, chunk by chunk
    queued: int = 0  # rows waiting for a slot
    rows_done: int = 0  # rows finished since the engine was made
    tokens_out: int = 0  # their output tokens
    prefill_s: float = 0.0  # engine time spent prefilling (its own chunks and method prefills)
    step_s: float = 0.0  # engine time spent in decode steps

    def progress(self) -> tuple[int, int, int, int, float]:
        """(rows finished, their output tokens, rows decoding, their tokens so far, the share
        of engine time spent prefilling; 0.0 before any)."""
        busy = self.prefill_s + self.step_s
        return (self.rows_done, self.tokens_out, self.decoding, self.decoding_tokens,
                self.prefill_s / busy if busy > 0 else 0.0)

    @classmethod
    def total(cls, snapshots: Iterable[EngineSnapshot]) -> EngineSnapshot:
        """The sum of several engines: counts, tokens and times added; the chunks of the
        engines compressing now added (their total only when each knows its own); the time
        left of their readings is the longest one's (they read side by side)."""
        snaps = list(snapshots)
        reading = [s for s in snaps if s.compressing]
        totals = [s.chunks_total for s in reading]
        lefts = [s.reading_left_s for s in reading if s.reading_left_s is not None]
        summed = {f.name: sum(getattr(s, f.name) for s in snaps) for f in fields(cls)
                  if f.name not in ("chunks_read", "chunks_total", "reading_left_s")}
        return cls(**summed,
                   chunks_read=sum(s.chunks_read for s in reading),
                   chunks_total=(sum(t for t in totals if t is not None)
                                 if reading and None not in totals else None),
                   reading_left_s=max(lefts) if lefts else None)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSnapshot:
        """Back from ``dataclasses.asdict`` (another process's report); unknown keys ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _duration(s: float) -> str:
    return f"~{int(s // 60)}m{int(s % 60):02d}s left" if s >= 60 else f"~{int(s)}s left"


def _reading(s: EngineSnapshot) -> str:
    """A method prefill's progress: its documents' tokens, the chunks read of how many,
    and the time left at the rate so far."""
    total = s.chunks_total if s.chunks_total and s.chunks_read <= s.chunks_total else None
    read = f"chunk {s.chunks_read} of {total}" if total else f"chunks read: {s.chunks_read}"
    left = f", {_duration(s.reading_left_s)}" if s.reading_left_s is not None else ""
    return f"{s.compressing_tokens} document tokens, {read}{left}"


def describe(s: EngineSnapshot) -> str:
    """What the engine(s) hold now, as the progress line says it (module contract)."""
    compressing = f"{s.compressing} compressing ({_reading(s)}), " if s.compressing else ""
    return (f"{s.decoding} decoding ({s.decoding_tokens} tokens), {compressing}{s.prefilling} "
            f"prefilling, {s.queued} queued")


def engines_line(s: EngineSnapshot, engines: int = 1) -> str:
    """``describe`` headed by how many engines it sums (module contract)."""
    head = "engine" if engines <= 1 else f"{engines} engines"
    return f"{head}: {describe(s)}"
