"""Load generated modules from real files (Triton reads kernel source with ``inspect``).

A module is loaded once per process for the GPU (compiled kernels) and, on demand, once
more with ``TRITON_INTERPRET=1`` for CPU tensors: Triton decides at decoration time whether
``@triton.jit`` builds a compiled or an interpreted function.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from attncc.cache import atomic_write, cache_dir, content_key
from attncc.runtime import triton_key

_LOADED: dict[tuple[Path, bool], ModuleType] = {}


@contextlib.contextmanager
def interpreter(enabled: bool) -> Iterator[None]:
    """Set TRITON_INTERPRET for the duration (Triton reads it at decoration and run time)."""
    if not enabled:
        yield
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def module_path(name: str, source: str) -> Path:
    """Where the module for ``source`` lives; written once, atomically."""
    path = cache_dir() / "modules" / f"{name}_{content_key(source)[:20]}.py"
    if not path.exists() or path.read_text() != source:
        atomic_write(path, source)
    return path


def load_module(path: Path, interpreted: bool) -> ModuleType:
    key = (path, interpreted)
    if key in _LOADED:
        return _LOADED[key]
    module_name = f"attncc_generated.{path.stem}{'_interp' if interpreted else ''}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    with interpreter(interpreted):
        spec.loader.exec_module(module)
    if not interpreted and "triton" in sys.modules:
        triton_key.install()  # its first compile or cache hit then skips hashing libtriton
    _LOADED[key] = module
    return module
