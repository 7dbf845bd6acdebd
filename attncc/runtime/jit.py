"""Load generated modules from real files (Triton reads kernel source with ``inspect``).

A module is loaded once per process for the GPU (compiled kernels) and, on demand, once
more with ``TRITON_INTERPRET=1`` for CPU tensors: Triton decides at decoration time whether
``@triton.jit`` builds a compiled or an interpreted function.
"""

from __future__ import annotations

import contextlib
import functools
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


@functools.cache
def interpreter_problem() -> str | None:
    """Why Triton's interpreter (CPU calls, ``attncc check --device cpu``) cannot run here, or
    None. Triton 3.6's interpreter turns one-element arrays into Python scalars, which numpy
    2.4 refuses: every interpreted kernel then fails inside Triton ("only 0-dimensional arrays
    can be converted to Python scalars", seen on a GPU machine with numpy 2.4)."""
    import numpy
    import triton

    def release(version: str) -> tuple[int, ...]:
        return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())

    if release(triton.__version__) == (3, 6) and release(numpy.__version__) >= (2, 4):
        return (
            f"Triton {triton.__version__}'s interpreter (CPU tensors) fails under numpy "
            f"{numpy.__version__}: install numpy<2.4, or run on a CUDA device"
        )
    return None


def require_interpreter() -> None:
    """Raise ``RuntimeError`` (one line, the fix) where ``interpreter_problem`` says so."""
    problem = interpreter_problem()
    if problem is not None:
        raise RuntimeError(problem)


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
