"""Compression methods, one module each, found by scanning this package.

Contract: every module here except the interfaces (``INTERFACES``: ``base``, the
method contract; ``chunks``, the chunking the retrieval methods share; ``lm_scoring``, an
optional eval interface) defines one
``CompressionMethod`` subclass (stages/compression/base.py) and its settings model. ``registry()`` imports
the modules (pkgutil, no hand-written list) and returns one instance per method,
keyed by name, in display order; adding a method is adding a module (and its test).
Importing this package loads the registry, so the settings models are registered
with ``schemas.compression.CompressionSpec`` (which loads this package by name when it
validates a spec: plugin discovery).

Method modules import only light modules at their top (schemas, stages.rows, ...);
models, torch and the method's own engine (stages/finch, stages/autocompressor) load
inside the hooks, so that validating a spec stays fast and nothing imports in a cycle.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from schemas.compression import CompressionSpec
from stages.compression.base import CompressionMethod

INTERFACES = ("base", "chunks", "lm_scoring")  # modules of contracts and shared parts, not methods
__all__ = ["CompressionMethod", "budgeted_names", "method_for", "method_names", "methods_table", "registry"]


@functools.lru_cache(maxsize=1)
def registry() -> Mapping[str, CompressionMethod]:
    """name -> method, every module of this package scanned, in (order, name) order."""
    found: dict[str, CompressionMethod] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in INTERFACES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        classes = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, CompressionMethod)
            and obj.__module__ == module.__name__
            and not inspect.isabstract(obj)
        ]
        if len(classes) != 1:
            raise TypeError(
                f"{module.__name__} must define exactly one CompressionMethod, found {len(classes)}"
            )
        method = classes[0]()
        _check(method, module.__name__)
        if method.name in found:
            raise TypeError(f"compression method {method.name!r} is defined twice")
        found[method.name] = method
    ordered = sorted(found.values(), key=lambda m: (m.order, m.name))
    return MappingProxyType({m.name: m for m in ordered})


def _check(method: CompressionMethod, where: str) -> None:
    """A method's declaration is complete and agrees with its settings model."""
    for attr in ("name", "spec_model", "summary", "runs_at"):
        if not hasattr(method, attr):
            raise TypeError(f"{where}: {type(method).__name__} does not declare {attr!r}")
    if not issubclass(method.spec_model, CompressionSpec):
        raise TypeError(f"{where}: spec_model must subclass schemas.compression.CompressionSpec")
    if method.spec_model.model_fields["method"].default != method.name:
        raise TypeError(f"{where}: {method.spec_model.__name__}.method must default to {method.name!r}")
    if method.eval_budgeted and "target_tokens" not in method.spec_model.model_fields:
        raise TypeError(f"{where}: an eval_budgeted method needs a target_tokens setting")


def method_names() -> tuple[str, ...]:
    """The registered methods' names, in the registry's display order."""
    return tuple(registry())


def method_for(config: CompressionSpec) -> CompressionMethod:
    """The method of a spec's ``compression`` settings; ValueError when none is registered."""
    method = registry().get(config.method)
    if method is None:
        raise ValueError(
            f"unknown compression method {config.method!r}; allowed: {', '.join(registry())}"
        )
    return method


def methods_table() -> str:
    """The Markdown table of every registered method (``longdoc methods``; README rows)."""
    from stages.compression.base import WHERE

    rows = ["| method | what it keeps | where it runs |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {m.summary} | {WHERE[m.runs_at]} |" for m in registry().values()]
    return "\n".join(rows)


def budgeted_names() -> tuple[str, ...]:
    """Methods with an exact context budget (target_tokens), in display order."""
    return tuple(m.name for m in registry().values() if m.eval_budgeted)


registry()  # register every settings model with schemas.compression.CompressionSpec on import
