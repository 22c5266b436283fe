"""``scripts/build_catalog.py`` as a module (``scripts/`` is not a package)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_catalog.py"


@functools.cache
def build_catalog_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_catalog", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_catalog"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
