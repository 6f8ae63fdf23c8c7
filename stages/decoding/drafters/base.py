"""What a drafter is: the ``Drafter`` interface the engine speculates through.

Contract: a drafter proposes, for rows of the engine, tokens likely to come next; the
engine verifies them against the model in one forward pass, so a bad draft costs
time, never correctness (greedy output is exactly plain greedy; sampling keeps the
model's distribution by Leviathan et al.'s rule, which holds for any deterministic
draft). The engine never names a drafter: it calls these methods only.

- ``begin(row, lookup_ids)``: a row joins; ``lookup_ids`` is its ORIGINAL prompt
  (prefix + whole document + query), even when the model sees a compressed context.
- ``extend(row, tokens)``: the row's output grew by ``tokens`` (accepted drafts and
  the model's own token).
- ``propose(rows, limits) -> list[Draft]``: one draft per row, at most ``limits[i]``
  tokens (0: propose nothing). The one method a drafter must implement.
- ``finish(row, output)``: the row left (finished or failed); ``output`` is what it
  generated. A drafter drops the row's state here (and may learn from the output).

``Draft.level`` is the drafter's confidence signal, the key the engine learns
acceptance by (adaptive.AcceptanceModel): the matched context length ``n``, or
``(source, n)`` when one drafter has sources whose acceptance differs.

A drafter is made once per engine with the run's ``DecodeConfig`` (its n-gram
settings) and lives as long as the engine (an actor), so what it learns from finished
rows carries across Ray batches. Not thread-safe: the engine calls it from one thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from stages.decoding.config import DecodeConfig


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    level: Hashable = 0  # matched context length n, or (source, n); 0 = no match

    @classmethod
    def none(cls) -> Draft:
        return cls([], 0)


class Drafter(ABC):
    """Proposes draft tokens for rows (see the module docstring)."""

    #: The name ``generation.speculative.method`` selects this drafter by.
    name: ClassVar[str]
    #: One line for the docs: where its drafts come from.
    summary: ClassVar[str]

    def __init__(self, config: DecodeConfig) -> None:
        self.config = config

    def begin(self, row: int, lookup_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """A row joins with its original prompt ids."""

    def extend(self, row: int, tokens: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The row's output grew by ``tokens``."""

    @abstractmethod
    def propose(self, rows: Sequence[int], limits: Sequence[int]) -> list[Draft]:
        """One Draft per row, each at most ``limits[i]`` tokens."""

    def finish(self, row: int, output: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The row left; ``output`` is everything it generated."""
