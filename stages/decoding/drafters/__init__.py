"""Drafters, one module each, found by scanning this package: the speculation seam.

Contract: every module here except ``base`` and ``ngram_index`` (a shared index, not a
drafter) defines one ``Drafter`` subclass (base.py). ``registry()`` returns name ->
class, in name order; ``drafter_for(config)`` makes the one a ``DecodeConfig`` names
(``speculative``; ``none`` -> None, no drafting). The job spec's
``generation.speculative.method`` accepts ``none`` and these names (schemas load this
package by name when they validate a spec, as they do compression methods). Adding a
drafter is adding one module and its test.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from stages.decoding.drafters.base import Draft, Drafter

if TYPE_CHECKING:
    from stages.decoding.config import DecodeConfig

__all__ = ["NONE", "Draft", "Drafter", "drafter_for", "drafter_names", "registry"]

NONE = "none"  # speculative.method that turns drafting off
_NOT_DRAFTERS = ("base", "ngram_index")


@functools.lru_cache(maxsize=1)
def registry() -> Mapping[str, type[Drafter]]:
    """name -> Drafter class, every module of this package scanned."""
    found: dict[str, type[Drafter]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _NOT_DRAFTERS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        classes = [
            obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, Drafter) and obj.__module__ == module.__name__
            and not inspect.isabstract(obj)
        ]
        if len(classes) != 1:
            raise TypeError(f"{module.__name__} must define exactly one Drafter, found {len(classes)}")
        cls = classes[0]
        for attr in ("name", "summary"):
            if not isinstance(getattr(cls, attr, None), str):
                raise TypeError(f"{module.__name__}: {cls.__name__} does not declare {attr!r}")
        if cls.name in found or cls.name == NONE:
            raise TypeError(f"drafter name {cls.name!r} is taken")
        found[cls.name] = cls
    return MappingProxyType(dict(sorted(found.items())))


def drafter_names() -> tuple[str, ...]:
    """Every value ``speculative.method`` accepts: none, then the drafters."""
    return (NONE, *registry())


def drafter_for(config: DecodeConfig) -> Drafter | None:
    """The drafter ``config.speculative`` names, made for ``config``; None for ``none``."""
    if config.speculative == NONE:
        return None
    cls = registry().get(config.speculative)
    if cls is None:
        raise ValueError(f"speculative method {config.speculative!r}; allowed: {', '.join(drafter_names())}")
    return cls(config)
