"""Value checks the job spec's validators share: URIs, placeholders, path-safe words.

Contract: each ``check_*`` returns its value or raises ValueError whose message says
the bad value and what is allowed (pydantic prefixes the field path). ``FieldError``
lets a model validator name the field it is about (schemas/errors.py reads it).
Imports nothing of the project.
"""

from __future__ import annotations

import os
import posixpath
import re
import reprlib

#: URI schemes the readers and writers support (a plain path has none).
URI_SCHEMES = ("file", "s3", "gs", "gcs", "memory")
INPUT_PLACEHOLDERS = ("run_date",)
OUTPUT_PLACEHOLDERS = ("job", "run_date")

#: Byte order marks of UTF-16 (Windows "Unicode" exports, PowerShell's ``>``): a spec or an
#: input file starting with one is named as UTF-16, with the conversion that reads it.
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

#: A job name: it becomes a folder ({job}), a Ray submission id and a Kubernetes name.
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}\Z")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*(?:::[A-Za-z][A-Za-z0-9+.\-]*)*):(//)?")


_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel = 80, 80, 3
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 6


def shown(value: object) -> str:
    """A user's value for an error message: its repr, cut while it is built (reprlib), so a
    5 MB string or a YAML alias bomb costs no more than a short value."""
    return _SHOWN.repr(value)


class FieldError(ValueError):
    """A model validator's error about one field: ``field`` is its path relative to the
    model raising it (``"min_ngram"``, ``"task.questions"``), so the error report names
    ``generation.speculative.min_ngram`` instead of the model as a whole."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


#: ``scheme://user:secret@host...``: credentials written into a URI. A user may hold '@' (an
#: e-mail address) and a secret '/' and '@', so they run to the last '@' (a message masks too
#: much rather than too little).
_USERINFO_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^/\s]*:\S*@")


def without_userinfo(text: str) -> str:
    """``text`` with the credentials before the last '@' of each URL in it replaced by ``***``,
    for a message."""
    return re.sub(r"([A-Za-z][A-Za-z0-9+.\-]*://)(?:[^/\s]*:\S*|[^/:\s]*)@", r"\1***@", text)


def check_uri(uri: str, placeholders: tuple[str, ...]) -> str:
    """``uri`` if its scheme is supported and its ``{placeholders}`` are known, else ValueError.

    Pure syntax: whether the scheme's filesystem package is installed is checked where
    the spec runs (schemas/environment.check_environment), not here.
    """
    if not uri.strip():
        raise ValueError("is empty; allowed: a path or a URI with scheme " + ", ".join(URI_SCHEMES))
    if _USERINFO_RE.match(uri):  # first, whatever the scheme: never echoed, shown without them
        raise ValueError(
            f"holds credentials before '@' ({without_userinfo(uri)[:80]}): longdoc takes them from the "
            "environment, a profile or a Secret, never from the spec, which is printed, kept in run records "
            "and sent to a cluster; fix: remove them from the URI and export AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or the store's own) instead")
    m = _SCHEME_RE.match(uri)
    if m and (len(m.group(1)) > 1 or m.group(2)):  # one letter and no '//' is a Windows drive
        scheme = m.group(1)
        if scheme not in URI_SCHEMES:
            raise ValueError(
                f"{shown(without_userinfo(uri))} has unsupported scheme {scheme + '://'!r}; allowed: "
                + ", ".join(s + "://" for s in URI_SCHEMES) + " or a plain path"
            )
        if not m.group(2):
            raise ValueError(f"{shown(uri)} is malformed: write {scheme}://... (two slashes)")
    names = _PLACEHOLDER_RE.findall(uri)
    unknown = [n for n in names if n not in placeholders]
    if unknown:
        raise ValueError(
            f"{shown(uri)} has unknown placeholder {{{unknown[0]}}}; allowed: "
            + ", ".join("{" + p + "}" for p in placeholders)
        )
    if "{" in _PLACEHOLDER_RE.sub("", uri) or "}" in _PLACEHOLDER_RE.sub("", uri):
        raise ValueError(
            f"{shown(uri)} has an unbalanced brace; placeholders look like "
            + ", ".join("{" + p + "}" for p in placeholders)
        )
    return uri




def location(uri: str) -> str:
    """``uri`` as a comparable location: one spelling per place, found without any I/O.

    A plain path or ``file://`` URI becomes an absolute, normalised path (``..``, ``.``
    and doubled slashes resolved lexically; relative paths against the current folder);
    ``gcs://`` becomes ``gs://``; a remote URI keeps its scheme with its path normalised.
    Symlinks are not followed (that needs the filesystem: schemas.environment.check_environment).
    """
    m = _SCHEME_RE.match(uri)
    scheme = m.group(1) if m and (len(m.group(1)) > 1 or m.group(2)) else None
    if scheme in (None, "file"):
        path = uri[len("file://"):] if scheme == "file" else uri
        return posixpath.normpath(os.path.abspath(os.path.expanduser(path)))
    rest = uri[m.end():] if m else uri
    scheme = "gs" if scheme == "gcs" else scheme
    return f"{scheme}://" + posixpath.normpath("/" + rest).lstrip("/")


def check_output_root(uri: str) -> str:
    """``uri`` if the output root it names has a parent folder, else ValueError.

    The run records live in the root's sibling ``{uri}.runs`` (stages/write.py
    ``runs_root``): a bucket (``s3://bucket``), a filesystem root or ``.``/``..`` has none
    in the same place.
    """
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    parts = [p for p in rest.rstrip("/").split("/") if p]
    last = parts[-1] if parts else ""
    bucket_only = uri.split("://", 1)[0] in ("s3", "gs", "gcs") and len(parts) < 2
    if last in ("", ".", "..", "~") or bucket_only:
        raise ValueError(
            f"{shown(uri)} names no folder with a parent; the run records go beside the output "
            "folder ({output}.runs/), so name a folder: e.g. s3://bucket/longdoc/{job} or out/{job}"
        )
    return uri
