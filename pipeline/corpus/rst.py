"""Turn the Python documentation's reST sources into readable plain text.

Tooling for ``pipeline.corpus.build`` only; the runtime pipeline never imports it.

Contract: ``rst_to_text(source, labels)`` keeps headings (as bare lines), paragraphs,
lists, tables (one ``cell | cell`` line per row) and code (indented by four spaces);
it drops Sphinx bookkeeping (index entries, labels, comments, toctrees) and turns
inline roles into what the rendered HTML shows (``:func:`sorted``` -> ``sorted()``,
``:pep:`8``` -> ``PEP 8``, ``:ref:`label``` -> the referenced section title when
``labels`` knows it). It is a pragmatic converter for these sources, not a general
reST parser: unusual constructs degrade to slightly noisy text, never to lost prose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pipeline.corpus.tables import read_table

# Directive bodies shown verbatim as code.
_CODE = {"doctest", "code-block", "code", "testcode", "testoutput", "sourcecode",
         "productionlist", "parsed-literal"}
# Directives that carry nothing a reader of the text needs.
_DROP = {"index", "toctree", "tabularcolumns", "testsetup", "testcleanup", "highlight",
         "contents", "sectionauthor", "moduleauthor", "currentmodule", "include",
         "literalinclude", "image", "figure", "only", "raw", "audit-event", "miscnews",
         "program", "module", "default-role", "role", "c:namespace", "ifconfig"}
# Admonition-like directives: body kept as prose behind a label.
_LABELS = {"note": "Note:", "warning": "Warning:", "seealso": "See also:",
           "important": "Important:", "caution": "Caution:", "tip": "Tip:", "hint": "Hint:",
           "attention": "Attention:", "danger": "Danger:", "admonition": "",
           "impl-detail": "CPython implementation detail:", "epigraph": "", "list-table": "",
           "table": "", "container": "", "centered": "", "hlist": ""}
_SUBSTITUTIONS = {"version": "3.11", "release": "3.11.2"}  # Debian 12 python3.11-doc
_ADORN = re.compile(r"^([=\-~^*+#\"'`:.])\1{2,}$")
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:.-]+)::\s*(.*)$")
_FOOTNOTE = re.compile(r"^\.\.\s+\[(?:#[\w-]*|\d+|\*)\]\s*(.*)$")
_LABEL = re.compile(r"^\.\.\s+_([^:]+):\s*$")
_FIELD = re.compile(r"^(\s*):([^:`]+):(\s|$)")
_OPTION = re.compile(r"^\s*:[\w-]+:")
_INLINE = re.compile(
    r"``(?P<lit>.+?)``(?!`)"
    r"|(?<![\w`]):(?P<role>[\w:+.-]+):`(?P<rtext>[^`]+)`"
    r"|`(?P<ltext>[^`<]*?)\s*<(?P<target>[^`>]+)>`(?:__?)?"
    r"|`(?P<ref>[^`]+)`__?"
    r"|`(?P<interp>[^`]+)`"
    r"|\*\*(?P<strong>[^*\s](?:.*?[^*\s])?)\*\*"
    r"|(?<![\w*])\*(?P<em>[^*\s](?:[^*]*?[^*\s])?)\*(?![\w*])"
    r"|\s?\[(?:#[\w-]*|\d+|\*)\]_"
    r"|\|(?P<subst>[\w-]+)\|(?:__?)?"
    r"|(?<![\w-])(?P<word>[A-Za-z0-9][\w-]*[A-Za-z0-9])__?(?!\w)"
    r"|\\(?P<esc>.)",
    re.S,
)
_CALLABLE_ROLES = {"func", "meth", "py:func", "py:meth", "c:func", "c:macro"}


def _role(role: str, text: str, labels: Mapping[str, str]) -> str:
    text = " ".join(text.split())
    titled = re.match(r"(.+?)\s*<([^>]+)>$", text)
    if titled and role not in {"abbr"}:
        return titled.group(1)
    short = text.startswith("~")
    target = text.lstrip("~!")
    if role in {"ref", "doc"}:
        return labels.get(target, target.rsplit("/", 1)[-1].replace("-", " "))
    if role in {"pep", "rfc"}:
        return f"{role.upper()} {target.split('#')[0]}"
    if role in {"issue", "gh"}:
        return f"{'bpo' if role == 'issue' else 'gh'}-{target}"
    if short:
        target = target.rsplit(".", 1)[-1]
    if role in _CALLABLE_ROLES and not target.endswith(")"):
        target += "()"
    return target


def inline(text: str, labels: Mapping[str, str] | None = None) -> str:
    """Replace reST inline markup in ``text`` by its rendered plain form."""
    labels = labels or {}

    def repl(m: re.Match[str]) -> str:
        g = m.groupdict()
        if g["lit"] is not None:
            return g["lit"]
        if g["role"] is not None:
            return _role(g["role"], g["rtext"], labels)
        for key in ("ltext", "ref", "interp", "strong", "em", "word"):
            if g[key] is not None:
                return g[key] or g.get("target") or ""
        if g["subst"] is not None:
            return _SUBSTITUTIONS.get(g["subst"], g["subst"])
        if g["esc"] is not None:
            return "" if g["esc"].isspace() else g["esc"]
        return ""  # footnote reference

    return _INLINE.sub(repl, text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _content_indent(line: str) -> int:
    """Column where a line's text starts, past a list marker (``* ``, ``- ``, ``1. ``)."""
    m = re.match(r"\s*(?:[*+-]|#\.|\d+\.|\(?\w\))\s+", line)
    return m.end() if m else _indent(line)


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index after the block of lines indented deeper than ``indent`` (blank lines included)."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1  # trailing blank lines belong to the surrounding text
    return end


def _dedent(lines: list[str]) -> list[str]:
    depth = min((_indent(x) for x in lines if x.strip()), default=0)
    return [x[depth:] for x in lines]


def _reindent(lines: list[str], pad: int) -> list[str]:
    return [" " * pad + x if x.strip() else "" for x in lines]


def _directive(name: str, arg: str, body: list[str], labels: Mapping[str, str]) -> list[str]:
    """Plain-text lines (not yet indented) for one directive and its body."""
    while arg.endswith("\\") and body:  # signature continued on the next line
        arg, body = f"{arg[:-1].rstrip()} {body[0].strip()}", body[1:]
    while body and _OPTION.match(body[0]):
        body = body[1:]
    body = _dedent(body)
    if name in _DROP:
        return []
    if name in _CODE:
        if name == "productionlist":  # grammar rules: drop the cross-reference backticks
            body = [x.replace("`", "") for x in body]
        return [""] + _reindent(body, 4) + [""]
    if name in {"versionadded", "versionchanged", "deprecated", "deprecated-removed"}:
        version, _, rest = arg.partition(" ")
        if name == "deprecated-removed":
            removed, _, rest = rest.partition(" ")
            head = f"Deprecated since version {version}, will be removed in version {removed}"
        else:
            head = {"versionadded": "New in version", "versionchanged": "Changed in version",
                    "deprecated": "Deprecated since version"}[name] + f" {version}"
        text = _convert(([rest] if rest else []) + body, labels)
        return ["", f"{head}: {text[0]}" if text else f"{head}."] + text[1:] + [""]
    if name in {"rubric", "topic", "sidebar"}:
        return ["", inline(arg, labels), ""] + _convert(body, labels)
    if name == "availability":
        return ["", f"Availability: {inline(arg, labels)}", ""]
    if name in _LABELS or name.startswith("rst:"):
        text = _convert(([arg] if arg else []) + body, labels)
        while text and not text[0].strip():
            text = text[1:]
        label = _LABELS.get(name, "")
        if text and label:
            text[0] = f"{label} {text[0]}"
        return [""] + text + [""]
    # Object descriptions (function, method, class, opcode, cmdoption, ...):
    # the signature as written, then the description indented under it.
    return ["", arg] + _reindent(_convert(body, labels), 4) + [""]


def _title_at(lines: list[str], i: int) -> tuple[str, int] | None:
    """(title, lines consumed) when a section heading starts at ``lines[i]``."""
    here = lines[i].strip()
    if _ADORN.match(here) and i + 2 < len(lines) and _ADORN.match(lines[i + 2].strip()):
        return lines[i + 1].strip(), 3
    if (here and not _ADORN.match(here) and _indent(lines[i]) == 0 and i + 1 < len(lines)
            and _ADORN.match(lines[i + 1].strip()) and len(lines[i + 1].strip()) >= len(here) - 2):
        return here, 2
    return None


def _convert(lines: list[str], labels: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    i, n = 0, len(lines)
    while i < n:
        line, stripped = lines[i], lines[i].strip()
        ind = _indent(line)
        if not stripped:
            out.append("")
            i += 1
        elif stripped.startswith("..") and (stripped == ".." or stripped.startswith(".. ")):
            end = _block_end(lines, i + 1, ind)
            directive, note = _DIRECTIVE.match(stripped), _FOOTNOTE.match(stripped)
            if directive:
                got = _directive(directive.group(1), directive.group(2), lines[i + 1 : end], labels)
                out += _reindent(got, ind)
            elif note:
                text = _convert([note.group(1)] + _dedent(lines[i + 1 : end]), labels)
                out += _reindent(["", "Footnote: " + (text[0] if text else "")] + text[1:], ind)
            i = end  # labels, comments and substitution definitions vanish
        elif (title := _title_at(lines, i)) is not None:
            out += ["", inline(title[0], labels), ""]
            i += title[1]
        elif _ADORN.match(stripped):  # a transition (horizontal rule)
            i += 1
        elif (table := read_table(lines, i)) is not None:
            rows, i = table
            out += _reindent([" | ".join(inline(c, labels) for c in row) for row in rows], ind)
        elif stripped.startswith(">>>"):
            end = i
            while end < n and lines[end].strip():
                end += 1
            out += lines[i:end]
            i = end
        else:
            end = i
            while end < n and lines[end].strip() and not lines[end].strip().startswith(".. "):
                end += 1
            para = [_FIELD.sub(r"\1\2:\3", x) for x in lines[i:end]
                    if not x.startswith((":tocdepth:", ":orphan:"))]  # Sphinx page metadata
            if not para:
                i = end
                continue
            text = inline("\n".join(para), labels).split("\n")
            last = text[-1].rstrip()
            if last.endswith("::"):
                text[-1] = last[:-2].rstrip() + (":" if last[:-2].strip() and
                                                   not last.endswith(" ::") else "")
                if not text[-1].strip():
                    text.pop()
                nxt = end
                while nxt < n and not lines[nxt].strip():
                    nxt += 1
                # The literal block is indented past the text of the paragraph's last line
                # (past the bullet, for a list item).
                base = _content_indent(lines[end - 1])
                if nxt < n and _indent(lines[nxt]) > base:
                    lit_end = _block_end(lines, nxt, base)
                    out += text + [""] + _reindent(_dedent(lines[nxt:lit_end]), base + 4)
                    i = lit_end
                    continue
            out += text
            i = end
    return out


def rst_to_text(source: str, labels: Mapping[str, str] | None = None) -> str:
    """Plain text of one reST document: trimmed lines, at most one blank line in a row."""
    lines = source.expandtabs(8).splitlines()
    out = [x.rstrip() for x in _convert(lines, labels or {})]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")
    return text + "\n"


def collect_labels(sources: Iterable[str]) -> dict[str, str]:
    """Map ``.. _label:`` targets to the heading that follows them (for ``:ref:`` roles)."""
    labels: dict[str, str] = {}
    for source in sources:
        lines = source.expandtabs(8).splitlines()
        for i, line in enumerate(lines):
            m = _LABEL.match(line.strip())
            if not m:
                continue
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or _LABEL.match(lines[j].strip())):
                j += 1
            title = _title_at(lines, j) if j < len(lines) else None
            if title:
                labels[m.group(1).strip()] = inline(title[0])
    return labels
