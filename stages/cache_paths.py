"""Where longdoc keeps what it makes once per machine, without importing torch.

Contract:
- ``cache_dir()``: ``$LONGDOC_CACHE``, default ``~/.cache/longdoc`` (read at each call, so
  a test or a job's environment may set it late; a leading ``~`` is the home folder, as a
  shell would make it: a value set in a job's environment is not expanded by one).
- ``embedded_model_folder()``: the folder the bundled generator is converted into
  (``cache_dir()/models/EMBEDDED_DIR_NAME``); stages/model_loading.py converts it there on
  first use. Its subfolders elsewhere: ``finch_heads/``, ``kernels/``, ``linear_plans/``
  and the ``random:`` draws under ``models/``.
Why a module of its own: the refusals before any model loads (pipeline/model_checks.py,
stages/context_budget.py) need these paths in well under a second, and
stages/model_loading.py imports torch (seconds); one spelling keeps them from drifting.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Folder of the converted embedded model under ``cache_dir()/models``.
EMBEDDED_DIR_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("LONGDOC_CACHE", Path.home() / ".cache" / "longdoc")).expanduser()


def embedded_model_folder() -> Path:
    """Where the bundled generator's safetensors and tokenizer are (or will be) converted."""
    return cache_dir() / "models" / EMBEDDED_DIR_NAME
