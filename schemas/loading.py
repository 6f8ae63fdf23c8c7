"""Load a JobSpec from YAML plus ``--set a.b=value`` overrides, with readable errors.

Contract: ``load_spec`` either returns a valid frozen JobSpec or raises SpecError
whose message lists every problem as ``field.path: what is wrong``. Override values
are parsed as YAML scalars/lists (``--set resources.actors=[1,4]`` works).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.spec import JobSpec


class SpecError(ValueError):
    """A job spec (file or override) is invalid; the message names each field path."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid job spec {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"got {e.get('input')!r}; allowed: {e['ctx']['expected']}"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `longdoc validate --schema` lists fields)"
        elif e["type"] == "union_tag_invalid":
            msg = f"unknown method {e.get('input', {}).get('method')!r}; allowed: {e['ctx']['expected_tags']}"
        lines.append(f"  - {loc or '<root>'}: {msg}")
    return "\n".join(lines)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` override applied."""
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"override {item!r} must look like dotted.key=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise SpecError(f"override {item!r}: value is not valid YAML ({e})") from e
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise SpecError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def spec_from_dict(data: dict[str, Any], source: str = "<dict>") -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"job spec {str(path)!r} not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SpecError(f"job spec {str(path)!r} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"job spec {str(path)!r} must be a YAML mapping at the top level")
    return spec_from_dict(apply_overrides(data, overrides or []), source=str(path))
