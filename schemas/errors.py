"""Turn a pydantic ValidationError on a job spec into lines a user can act on.

Contract: ``format_validation_error(err, source)`` returns one line per
problem, ``  - field.path: got VALUE; allowed: WHAT`` (or a sentence saying what is
wrong and what is allowed). Paths are the ones the user writes in YAML: pydantic's
internal labels (the discriminator tag of a union member, a scalar union member's
type name, ``function-after[...]``) are dropped, and a model validator's
``FieldError`` extends the path with the field it is about, so no line reads
``<root>: Value error``. A type error on a bounded field says the bounds too
(``got 1e+30; allowed: an integer, >= 1, <= 100000``). At most ``MAX_PROBLEMS`` lines
are listed (then how many more), and a bad value is shown through a bounded repr:
a huge or deeply aliased value (a YAML alias bomb) costs no more than a short one.
Imports only schemas/ modules.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from schemas.checks import FieldError, shown
from schemas.spec import JobSpec

#: pydantic error type -> what is allowed (constraint values come from the error's ctx).
_ALLOWED = {
    "greater_than_equal": ">= {ge}",
    "greater_than": "> {gt}",
    "less_than_equal": "<= {le}",
    "less_than": "< {lt}",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing_size": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "tuple_type": "a list",
    "list_type": "a list",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} item(s)",
    "finite_number": "a finite number",
    "string_too_short": "at least {min_length} character(s)",
    "string_too_long": "at most {max_length} character(s)",
}
#: Type errors whose "allowed" also names the field's bounds (ge/gt/le/lt).
_TYPE_KINDS = frozenset(
    ("int_parsing", "int_type", "int_from_float", "int_parsing_size", "float_parsing", "float_type")
)
#: Lines listed for one spec; a spec with thousands of mistakes is not read line by line.
MAX_PROBLEMS = 25


def _members(annotation: Any) -> list[type[BaseModel]]:
    """The BaseModel classes an annotation may hold (unwrapping Annotated / Optional / unions)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _alternatives(model: type[BaseModel]) -> list[type[BaseModel]]:
    """A base model's subclasses (a registry of settings models, one per method), deepest last."""
    out: list[type[BaseModel]] = []
    for sub in model.__subclasses__():
        out += [sub, *_alternatives(sub)]
    return out


def _tag(model: type[BaseModel], discriminator: str) -> Any:
    field = model.model_fields.get(discriminator)
    return None if field is None else field.default


class _Where:
    """A cleaned error location: the user's path, the model it ends in, the union it chose."""

    def __init__(self, loc: tuple, extra_key: bool) -> None:
        self.path: list[str] = []
        self.field: FieldInfo | None = None  # the field the path ends in, when a model field
        self.model: type[BaseModel] | None = JobSpec
        self.union: list[type[BaseModel]] = []  # alternatives of the last field, when a union
        self.discriminator = "method"
        self.tag: Any = None
        for i, el in enumerate(loc):
            if isinstance(el, str) and el.startswith("function-"):
                continue
            if isinstance(el, int):
                self.path.append(f"[{el}]")
                self.model, self.field = None, None
                continue
            if self.model is None and self.union:
                chosen = [m for m in self.union if _tag(m, self.discriminator) == el]
                if chosen:  # a discriminated union member's tag: not a user-visible key
                    self.model, self.tag = chosen[0], el
                    continue
            if self.model is not None and el in self.model.model_fields:
                info = self.model.model_fields[el]
                self.path.append(el)
                self.field = info
                members = _members(info.annotation)
                if len(members) == 1 and _alternatives(members[0]):
                    members = _alternatives(members[0])  # a base class whose subclasses register
                self.union = members if len(members) > 1 else []
                self.discriminator = info.discriminator if isinstance(info.discriminator, str) else "method"
                self.model = members[0] if len(members) == 1 else None
                continue
            if self.model is not None and extra_key and i == len(loc) - 1:
                self.path.append(str(el))  # the unknown key itself
            # else: a scalar union member's label ('int', 'tuple[int, int]'): dropped

    def dotted(self) -> str:
        return ".".join(self.path).replace(".[", "[")


def _got(value: Any) -> str:
    """A short repr (schemas.checks.shown): cut while it is built, never rendered whole."""
    text = shown(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bounds(field: FieldInfo | None) -> str:
    """``, >= 1, <= 100000`` from a field's constraints (empty when it has none)."""
    if field is None:
        return ""
    parts = []
    for m in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                parts.append(f"{sign} {getattr(m, attr)}")
    return "".join(f", {p}" for p in parts)


def _extra_message(where: _Where) -> str:
    key = where.path[-1]
    parent = where.model
    if where.tag is not None and where.union:
        takers = [str(_tag(m, where.discriminator)) for m in where.union if key in m.model_fields]
        if takers:
            return (
                f"{where.discriminator} {where.tag!r} takes no {key}; "
                f"{where.discriminator}s that take it: {', '.join(takers)}; fix: remove it (from the command "
                f"line: --set {'.'.join(where.path)}=null)"
            )
    allowed = [f for f in (parent.model_fields if parent else {}) if f != where.discriminator or not where.tag]
    hint = difflib.get_close_matches(key, allowed, n=1)
    msg = f"unknown field {key!r}"
    if where.tag is not None:
        msg += f" for {where.discriminator} {where.tag!r}"
    msg += f"; allowed: {', '.join(allowed) or 'no fields'}"
    return msg + (f" (did you mean {hint[0]!r}?)" if hint else "")


def _message(e: dict[str, Any], where: _Where) -> tuple[str, str | None]:
    """(message, allowed-or-None) for one pydantic error; allowed is merged across a union."""
    kind, ctx, value = e["type"], e.get("ctx") or {}, e.get("input")
    if kind == "extra_forbidden":
        return _extra_message(where), None
    if kind == "missing":
        return "missing; this field is required", None
    if kind == "literal_error":  # merged too: `auto` or a number is one line
        return f"got {_got(value)}", str(ctx.get("expected"))
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        where.path.append(ctx.get("discriminator", "'method'").strip("'"))
        allowed = ctx.get("expected_tags") or ", ".join(
            str(_tag(m, where.discriminator)) for m in where.union
        )
        got = value.get(where.path[-1]) if isinstance(value, dict) else None
        # A misspelt method ('selct', 'BM25') gets the suggestion a misspelt field name gets.
        tags = [t.strip(" '") for t in str(allowed).replace(" or ", ", ").split(",")]
        hint = difflib.get_close_matches(got.lower(), tags, n=1) if isinstance(got, str) else []
        return (("missing" if got is None else f"got {_got(got)}") + f"; allowed: {allowed}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")), None
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"got {_got(value)}; allowed: a mapping of fields (a YAML section)", None
    if kind in ("value_error", "assertion_error"):
        err = ctx.get("error")
        if isinstance(err, FieldError):
            where.path += err.field.split(".")
            return err.message, None
        return str(err) if err is not None else e["msg"], None
    if kind in _ALLOWED:
        try:
            allowed = _ALLOWED[kind].format(**ctx)
        except (KeyError, IndexError):
            allowed = None
        if allowed is not None:
            return f"got {_got(value)}", allowed + (_bounds(where.field) if kind in _TYPE_KINDS else "")
    return f"{e['msg']} (got {_got(value)})", None


def format_validation_error(err: ValidationError, source: str) -> str:
    """Readable, field-named lines for ``err``, headed by the spec's ``source``."""
    lines = [f"invalid job spec {source}:"]
    merged: dict[str, tuple[str, list[str]]] = {}  # path -> (got, allowed...) of scalar unions
    order: list[str] = []
    total = err.error_count()
    for e in err.errors(include_url=False):
        if len(order) >= MAX_PROBLEMS:
            break
        where = _Where(tuple(e["loc"]), extra_key=e["type"] == "extra_forbidden")
        msg, allowed = _message(e, where)
        path = where.dotted() or "(top level)"
        if allowed is None:
            order.append(f"{path}: {msg}")
            continue
        if path not in merged:
            merged[path] = (msg, [])
            order.append(path)
        if allowed not in merged[path][1]:
            merged[path][1].append(allowed)
    for item in order:
        if item in merged:
            got, allowed = merged[item]
            item = f"{item}: {got}; allowed: {' or '.join(allowed)}"
        lines.append(f"  - {item}")
    shown = sum(len(v[1]) for v in merged.values()) + len(order) - len(merged)
    if total > shown:
        lines.append(f"  ... and {total - shown} more problem(s) not listed; fix these first")
    return "\n".join(lines)
