"""Command-line options that take one of a fixed set of values, as Enums.

Why Enums: typer lists an Enum option's values in ``--help`` (``[auto|ray|local]``),
completes them in the shell, and refuses any other value before the command runs,
with one line naming the option and the choices (exit 2). A plain ``str`` option shows
``TEXT`` and leaves each command to check the value itself.

Contract:
- ``choice(name, values)``: a ``str`` Enum whose members are ``values`` in order (name =
  value). A command turns the member it gets back into a plain ``str`` with ``.value``
  before use (``str()`` of a member is ``Name.value``, not the value).
- ``spec_choice(name, model, field)``: the same from a ``Literal`` field of a pydantic
  settings model, so an option that sets a spec field offers exactly what the spec
  allows (one list of values, where the setting is defined).
- This module imports only pydantic-level schemas: every CLI module imports it when the
  ``longdoc`` command starts, before any heavy import (torch, Ray).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from schemas.generation_spec import GenerationSpec
from schemas.output import RETRY_POLICIES

#: ``longdoc run --runner`` (pipeline/runner.py ``resolve_runner``) and ``longdoc bench job --runner``.
RUNNERS = ("auto", "ray", "local")


def choice(name: str, values: Iterable[str]) -> type[Enum]:
    """A ``str`` Enum named ``name`` with one member per value (member name = value), in
    order; ValueError when ``values`` is empty or repeats a value."""
    vals = list(values)
    if not vals or len(set(vals)) != len(vals):
        raise ValueError(f"choice {name}: needs distinct values, got {vals}")
    return Enum(name, [(v, v) for v in vals], type=str, module=__name__)  # type: ignore[return-value]


def spec_choice(name: str, model: type[BaseModel], field: str) -> type[Enum]:
    """``choice`` of the values of ``model.field``, a ``Literal[...]`` (or ``Literal | None``)
    field; ValueError naming the field when it is not a Literal of strings."""
    annotation = model.model_fields[field].annotation
    literal = next((a for a in (annotation, *get_args(annotation)) if get_origin(a) is Literal), None)
    values = get_args(literal) if literal is not None else ()
    if not values or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{model.__name__}.{field} is not a Literal of strings: {annotation}")
    return choice(name, values)


Runner = choice("Runner", RUNNERS)
RetryErrors = choice("RetryErrors", RETRY_POLICIES)
#: generation.dtype and generation.compile, as ``longdoc bench decode`` sets them.
Dtype = spec_choice("Dtype", GenerationSpec, "dtype")
Compile = spec_choice("Compile", GenerationSpec, "compile")
