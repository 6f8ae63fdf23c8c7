"""Load a JobSpec from YAML plus ``--set a.b=value`` overrides, with readable errors.

Contract: ``load_spec`` either returns a valid frozen JobSpec or raises SpecError
whose message lists every problem as ``field.path: what is wrong`` (the bad value and
what is allowed). Override values are parsed as YAML scalars/lists
(``--set resources.actors=[1,4]`` works). A YAML mapping with a repeated key is an
error naming the key and its line, never a silent override.

What only the machine that runs the job can know (filesystem packages installed, local
paths present) is schemas/environment.py's ``check_environment``; ``check_run_date`` and
``check_run_id`` here validate the command-line values that become paths.
"""

from __future__ import annotations

import copy
import io
import re
import stat
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.checks import UTF16_BOMS, shown, without_userinfo
from schemas.errors import format_validation_error
from schemas.spec import JobSpec


class SpecError(ValueError):
    """A job spec (file or override) is invalid; the message names each field path."""


#: A job spec file larger than this is refused unread: real specs are a few KB, and PyYAML
#: builds Python objects for every node (a 5 MB spec takes seconds before any check).
MAX_SPEC_BYTES = 256 << 10
#: Keys one YAML mapping may hold: a spec section has a few dozen fields at most, and
#: reporting a hundred thousand unknown keys one by one is a flood, not an error.
MAX_MAPPING_KEYS = 1000
#: The C parser when PyYAML was built with libyaml (10-100x faster), else the pure one.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_BaseLoader):  # type: ignore[misc, valid-type]
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
                    f"duplicate key {shown(key)} (line {line}; first on line {seen[key]}); "
                    "allowed: each key once per mapping",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _NamedText(io.StringIO):
    """The YAML text with a ``name``: the C parser's marks cite it ("in FILE, line N")."""

    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name


def _check_sizes(node: yaml.Node | None, name: str) -> None:
    """Refuse a mapping of more than MAX_MAPPING_KEYS keys before any object is built."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:  # an alias is the same node object: visited once
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            if len(n.value) > MAX_MAPPING_KEYS:
                raise SpecError(
                    f"{name}, line {n.start_mark.line + 1}: a mapping of {len(n.value)} keys; "
                    f"allowed: at most {MAX_MAPPING_KEYS} (a spec section has a few dozen fields)"
                )
            stack.extend(v for kv in n.value for v in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


#: Characters YAML does not allow in a stream (PyYAML's reader refuses the same set).
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


def _bad_character(text: str, pos: int, name: str) -> SpecError:
    """A bad character (NUL, a control code) named by line and column, not by offset."""
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return SpecError(
        f"{name}, line {line}, column {col}: character U+{ord(text[pos]):04X} is not allowed "
        "in YAML; allowed: printable text (remove it, or write it as an escape in a "
        'double-quoted string, e.g. "\\0")'
    )


def parse_yaml(text: str, name: str = "<string>") -> Any:
    """``yaml.safe_load`` that raises on duplicate mapping keys; errors cite ``name``.

    SpecError (not a YAMLError) for what PyYAML would take long over or report badly:
    a mapping over MAX_MAPPING_KEYS, a bad character (by line and column), an integer
    too long for Python to read.
    """
    bad = _NON_PRINTABLE.search(text)
    if bad:
        raise _bad_character(text, bad.start(), name)
    loader = _UniqueKeyLoader(_NamedText(text, name))
    try:
        node = loader.get_single_node()
        _check_sizes(node, name)
        return None if node is None else loader.construct_document(node)
    except SpecError:
        raise
    except ValueError as e:  # int("1" * 5000): Python's limit on digits, not a YAMLError
        raise SpecError(f"job spec {shown(name)}: {e}; allowed: numbers of at most 19 digits") from None
    finally:
        loader.dispose()


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` override applied. Setting
    ``compression.method`` to another method drops the spec file's compression settings that
    method does not take as they are (``--set compression.method=select`` on a truncate spec
    leaves no ``keep: head_tail`` behind and keeps ``target_tokens``); the other overrides'
    settings stay, so a mistake among them is named."""
    out = copy.deepcopy(data) if data else {}  # keeps shared (aliased) values shared
    _switch_method(out, overrides)
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"--set {shown(item)}: must look like dotted.key=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise SpecError(f"--set {shown(item)}: empty key; allowed: dotted.key=value")
        try:
            value = parse_yaml(raw, name=f"--set {key}") if raw.strip() else ""
        except (yaml.YAMLError, SpecError) as e:
            raise SpecError(f"--set {shown(item)}: value is not valid YAML ({' '.join(str(e).split())}); fix: quote "
                            "it (--set 'key=\"text\"') or close its brackets") from e
        _refuse_list_index(item, parts, value, out)
        node = out
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                whole = ".".join(parts[: i + 1])
                raise SpecError(
                    f"--set {shown(item)}: {whole} is a value ({shown(nxt)}), not a section; "
                    f"allowed: set the whole value, e.g. --set {whole}={_flow(nxt)}"
                )
            node = nxt
        node[parts[-1]] = value
    return out


def _switch_method(out: dict[str, Any], overrides: list[str]) -> None:
    """Drop, in place, the file's ``compression`` settings that the method an override names
    does not take, or takes with other values (see ``apply_overrides``)."""
    method = next((raw.strip() for key, _, raw in (o.partition("=") for o in reversed(overrides))
                   if key.strip() == "compression.method"), None)
    block = out.get("compression")
    if method is None or not isinstance(block, dict) or block.get("method", "none") == method:
        return
    from schemas.compression import compression_models

    model = compression_models().get(method)
    if model is None:
        return  # an unknown method: validation names it with the methods allowed
    set_here = {o.partition("=")[0].strip().removeprefix("compression.") for o in overrides}
    for field in [f for f in block if f != "method" and f not in set_here]:
        try:  # a field of the same name may take other values (truncate's keep head_tail)
            model.model_validate({"method": method, field: block[field]})
        except ValidationError:
            del block[field]


def _refuse_list_index(item: str, parts: list[str], value: Any, data: dict[str, Any]) -> None:
    """SpecError for a key part that is a number (``resources.actors.1=8``): --set replaces
    whole values, and a spec has no field named by digits. The message shows the whole
    list to set instead, with the item replaced when the list is in the spec."""
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if index is None:
        return
    whole = ".".join(parts[:index])
    if not whole:
        raise SpecError(f"--set {shown(item)}: {parts[0]!r} is not a field; allowed: dotted.key=value with field names")
    current: Any = data
    for p in parts[:index]:
        current = current.get(p) if isinstance(current, dict) else None
    k = int(parts[index])
    if isinstance(current, list) and k < len(current) and index == len(parts) - 1:
        example = _flow([value if i == k else v for i, v in enumerate(current)])
    else:
        example = "'[FIRST, SECOND, ...]'"
    now = "not in the spec (its default applies)" if current is None else f"now {shown(current)}"
    raise SpecError(
        f"--set {shown(item)}: {parts[index]!r} is a list position, and --set replaces whole values "
        f"({whole} is {now}); allowed: set the whole list, e.g. --set {whole}={example}"
    )


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (flow style), for a command-line example."""
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    except yaml.YAMLError:
        return "VALUE"
    text = text.removesuffix("...").strip()
    return text if len(text) <= 80 else "VALUE"


def spec_from_dict(data: dict[str, Any], source: str = "<dict>") -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    p = Path(path)
    name = shown(str(path))
    try:
        st = p.stat()
    except PermissionError:
        raise SpecError(f"job spec {name} cannot be reached (permission denied on a folder of its path); fix: "
                        "let this user read it, or copy it where they can") from None
    except OSError:  # the path as given (a quoted ~ is no home folder: a shell expands it)
        raise SpecError(f"job spec {name} not found (looked for {shown(str(p.absolute()))}); fix: "
                        "give its path from the folder you run longdoc in, or an absolute one") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"job spec {name} is a folder; allowed: a YAML file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, /dev/zero never end it
        raise SpecError(f"job spec {name} is {_file_kind(st.st_mode)}; allowed: a regular YAML file")
    if st.st_size > MAX_SPEC_BYTES:
        raise SpecError(
            f"job spec {name} is {st.st_size} bytes; allowed: at most {MAX_SPEC_BYTES} "
            "(long texts such as questions belong in the input data)"
        )
    text = ""
    try:
        text = p.read_text(encoding="utf-8")
        data = parse_yaml(text, name=str(path))
    except yaml.YAMLError as e:
        # PyYAML's word for a tab in the indentation names no fix; the commonest cause gets one.
        # PyYAML's message spans lines; one line, and a fix, as every refusal has.
        # A field indented off its section reads as "mapping values are not allowed" (deeper) or
        # "while parsing a block mapping ... did not find expected key" (shallower): words that
        # name neither the indentation nor its fix.
        indent = any(w in str(e) for w in ("mapping values are not allowed", "expected <block end>",
                                           "while parsing a block mapping"))
        named = _named_lines(e, text)
        # In a { } section a placeholder's braces end the section: {uri: out/{job}} breaks there
        # (an unquoted placeholder on a line PyYAML names; a quoted one elsewhere is no cause).
        braces = "flow mapping" in str(e) and any(
            re.search(r"\{(job|run_date)\}", re.sub(r"'[^']*'|\"[^\"]*\"", "", line)) for line in named)
        # "mapping values are not allowed" at a colon that follows another ': ' on its line
        # (instruction: Answer: briefly) is the unquoted value, not the indentation.
        colon = "mapping values are not allowed" in str(e) and _colon_before_mark(e, text)
        fix = ("fix: indent with spaces, not tabs" if re.search(r"^ *\t", text, re.MULTILINE) else
               "fix: quote a value holding {job} or {run_date} inside a { } section ({uri: 'out/{job}'})"
               if braces else
               "fix: quote the value holding ': ' on the line named (instruction: 'Answer: briefly')"
               if indent and colon else
               "fix: indent the fields of one section by the same number of spaces as the line above the one "
               "named, and quote a value holding ': ' or ' #'" if indent else
               "fix: correct the YAML at the line named (close brackets and quotes; quote a value holding ': ' "
               "or ' #')")
        raise SpecError(f"job spec {name} is not valid YAML: {' '.join(str(e).split())}; {fix}") from None
    except UnicodeDecodeError as e:
        # Windows editors save "Unicode" as UTF-16, whose byte order mark names it.
        utf16 = p.read_bytes()[:2] in UTF16_BOMS
        fix = "it is UTF-16; fix: save it as UTF-8 (iconv -f utf-16 -t utf-8)" if utf16 else "fix: save it as UTF-8"
        raise SpecError(f"job spec {name} is not UTF-8 text (byte {e.start}); {fix}") from None
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {'list' if isinstance(data, list) else 'single value'}"
        raise SpecError(f"job spec {name} must be a YAML mapping at the top level (name:, input:, task: ...), "
                        f"and it is {what}; fix: start from jobs/sample-qa.yaml of longdoc's repository")
    # An error an override made is the override's, not the file's: the heading names both.
    source = f"{path} with --set {', '.join(map(_shown_override, overrides))}" if overrides else str(path)
    return spec_from_dict(apply_overrides(data, overrides or []), source=source)


#: Words that mark a value as a secret (``max_new_tokens`` is not one: "tokens" is not "token").
_SECRET_WORDS = re.compile(r"secret|passw|\btoken\b|_token\b|credential|access[_-]?key|api[_-]?key|\bkey\s*:",
                           re.IGNORECASE)


def _shown_override(override: str) -> str:
    """An override for a heading: a value under a key that names a secret as ``***``, and
    credentials in a URL left out (the heading is printed, and a review's were)."""
    key, eq, value = override.partition("=")
    if eq and _SECRET_WORDS.search(f"{key} {value}"):
        return f"{key}=***"
    return f"{key}{eq}{without_userinfo(value)}"


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words (for refusals of FIFOs, devices, sockets)."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return "not a regular file"


def _named_lines(error: yaml.YAMLError, text: str) -> list[str]:
    """The lines of ``text`` a PyYAML error names (its context and problem marks)."""
    lines = text.splitlines()
    marks = (getattr(error, "context_mark", None), getattr(error, "problem_mark", None))
    return [lines[m.line] for m in marks if m is not None and 0 <= m.line < len(lines)]


def _colon_before_mark(error: yaml.YAMLError, text: str) -> bool:
    """Whether the line of the error's problem mark holds a ': ' before the mark's column (the
    first colon of a value that holds a second one)."""
    mark = getattr(error, "problem_mark", None)
    lines = text.splitlines()
    if mark is None or not 0 <= mark.line < len(lines):
        return False
    return re.search(r":\s", lines[mark.line][:mark.column]) is not None


_DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}\Z")


def check_run_date(value: str, option: str = "--date") -> str:
    """``value`` if it is a real calendar date written YYYY-MM-DD, else SpecError."""
    try:
        if not _DATE_RE.match(value):
            raise ValueError
        date.fromisoformat(value)
    except ValueError:
        raise SpecError(
            f"{option}: {shown(value)} is not a calendar date; allowed: YYYY-MM-DD, e.g. 2026-01-31"
        ) from None
    return value


def check_run_id(value: str, option: str = "--run-id") -> str:
    """``value`` if it is safe as one path segment (it names files and folders), else SpecError."""
    if not _RUN_ID_RE.match(value) or value.startswith(".") or ".." in value:
        raise SpecError(
            f"{option}: {shown(value)} is not allowed; allowed: 1-128 of A-Z a-z 0-9 . _ - "
            "(no leading '.', no '..')"
        )
    return value


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (for editors: yaml-language-server, VS Code)."""
    schema = JobSpec.model_json_schema()
    schema.setdefault("title", "longdoc job spec")
    return schema
