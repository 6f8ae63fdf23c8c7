"""Whether this process could write under a local path, without creating anything there.

Contract: ``write_error(path)`` returns ``(folder, error)``: ``folder`` is the nearest
existing folder of ``path`` (``path`` itself when it exists), where a test file is made and
removed; ``error`` is None when that worked, else the ``OSError`` it raised (a
``NotADirectoryError`` when the nearest existing entry is a file). No folder is created:
a refused run leaves nothing behind. Used by the output's check (pipeline/preflight.py) and
the cache's (pipeline/model_checks.py), before any model loads.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def write_error(path: Path) -> tuple[Path, OSError | None]:
    here = path.expanduser().absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        if not here.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{here} is a file")
        fd, tmp = tempfile.mkstemp(prefix=".longdoc-preflight-", dir=here)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return here, e
    return here, None
