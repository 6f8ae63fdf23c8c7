"""Load a JobSpec from YAML plus ``--set a.b=value`` overrides, with readable errors.

Contract: ``load_spec`` either returns a valid frozen JobSpec or raises SpecError
whose message lists every problem as ``field.path: what is wrong`` (the bad value and
what is allowed). Override values are parsed as YAML scalars/lists
(``--set resources.actors=[1,4]`` works). A YAML mapping with a repeated key is an
error naming the key and its line, never a silent override.

``check_environment`` adds what only the machine that runs the job can know
(filesystem packages installed, local paths present); ``check_run_date`` and
``check_run_id`` validate the command-line values that become paths.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.errors import format_validation_error
from schemas.spec import JobSpec


class SpecError(ValueError):
    """A job spec (file or override) is invalid; the message names each field path."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (line {line}; first on line {seen[key]}); "
                    "allowed: each key once per mapping",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, name: str = "<string>") -> Any:
    """``yaml.safe_load`` that raises on duplicate mapping keys; errors cite ``name``."""
    loader = _UniqueKeyLoader(text)
    loader.name = name  # marks ("in FILE, line N") name the file, not "<unicode string>"
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` override applied."""
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: must look like dotted.key=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"--set {item!r}: empty key; allowed: dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise SpecError(f"--set {item!r}: value is not valid YAML ({e})") from e
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise SpecError(f"--set {item!r}: {p!r} is a value, not a section")
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
        data = parse_yaml(p.read_text(encoding="utf-8"), name=str(path))
    except yaml.YAMLError as e:
        raise SpecError(f"job spec {str(path)!r} is not valid YAML: {e}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"job spec {str(path)!r} is not UTF-8 text (byte {e.start})") from None
    if not isinstance(data, dict):
        raise SpecError(f"job spec {str(path)!r} must be a YAML mapping at the top level")
    return spec_from_dict(apply_overrides(data, overrides or []), source=str(path))


# ----------------------------------------------------------------------------- environment
#: Scheme -> (module that implements it, the longdoc extra that installs it).
_SCHEME_PACKAGES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
_LOCAL_PREFIXES = ("/", "./", "../", "~")


def _module_available(name: str) -> bool:
    # sys.modules[name] = None is Python's own "this import is blocked" marker.
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def _scheme(uri: str) -> str | None:
    return uri.split("://", 1)[0] if "://" in uri else None


def _looks_local(value: str) -> bool:
    return value.startswith(_LOCAL_PREFIXES) or value.startswith("file://")


def check_environment(spec: JobSpec, run_date: str | None = None, local_paths: bool = True) -> list[str]:
    """Problems that make ``spec`` fail on THIS machine, as ``field: message`` lines.

    - an ``s3://``/``gs://`` URI whose filesystem package (s3fs/gcsfs) is not installed;
    - with ``local_paths``: a local model/checkpoint/embedder path that does not exist,
      and a local input.uri that does not exist (checked only when it has no
      ``{run_date}`` or ``run_date`` is given). Hub ids stay lazy: only loading checks them.
    """
    problems = []
    for field, uri in (("input.uri", spec.input.uri), ("output.uri", spec.output.uri)):
        scheme = _scheme(uri)
        if scheme in _SCHEME_PACKAGES:
            module, extra = _SCHEME_PACKAGES[scheme]
            if not _module_available(module):
                problems.append(
                    f"{field}: {uri!r} needs the {module} package, which is not installed; "
                    f"install longdoc[{extra}] (pip install 'longdoc[{extra}]')"
                )
    if not local_paths:
        return problems
    uri = spec.input.uri
    if "{run_date}" in uri and run_date is not None:
        uri = uri.replace("{run_date}", run_date)
    if _scheme(uri) in (None, "file") and "{" not in uri:
        path = Path(uri.removeprefix("file://")).expanduser()
        if not path.exists():
            problems.append(f"input.uri: {uri!r} does not exist; allowed: an existing file or folder")
    models = [("generation.model", spec.generation.model)]
    models += [(f"compression.{k}", v) for k, v in spec.compression if k in ("checkpoint", "embedder")]
    for field, value in models:
        if isinstance(value, str) and _looks_local(value):
            path = Path(value.removeprefix("file://")).expanduser()
            if not path.exists():
                problems.append(
                    f"{field}: local path {value!r} does not exist; allowed: an existing "
                    "directory, a Hugging Face id, or an embedded: name"
                )
    return problems


# ----------------------------------------------------------------------------- run values
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_run_date(value: str, option: str = "--date") -> str:
    """``value`` if it is a real calendar date written YYYY-MM-DD, else SpecError."""
    try:
        if not _DATE_RE.match(value):
            raise ValueError
        date.fromisoformat(value)
    except ValueError:
        raise SpecError(
            f"{option}: {value!r} is not a calendar date; allowed: YYYY-MM-DD, e.g. 2026-01-31"
        ) from None
    return value


def check_run_id(value: str, option: str = "--run-id") -> str:
    """``value`` if it is safe as one path segment (it names files and folders), else SpecError."""
    if not _RUN_ID_RE.match(value) or value.startswith(".") or ".." in value:
        raise SpecError(
            f"{option}: {value!r} is not allowed; allowed: 1-128 of A-Z a-z 0-9 . _ - "
            "(no leading '.', no '..')"
        )
    return value


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (for editors: yaml-language-server, VS Code)."""
    schema = JobSpec.model_json_schema()
    schema.setdefault("title", "longdoc job spec")
    return schema
