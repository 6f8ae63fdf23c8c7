"""Import infra/gpu's scripts as modules (they run as ``python3 infra/gpu/<name>.py``, so
their folder is on sys.path when they run; here it is put there for them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

GPU_DIR = Path(__file__).resolve().parents[2] / "infra" / "gpu"


def gpu_script(name: str) -> ModuleType:
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
