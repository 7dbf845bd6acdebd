"""A Python file outside the package (a benchmark script, an example) loaded as a module, for
the tests that call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """``path`` executed as the module ``name`` (registered in ``sys.modules``: dataclasses
    look their module up there), with its own folder first on the import path while it runs,
    as for a script run by ``python3 PATH`` (benchmarks import their neighbours)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
